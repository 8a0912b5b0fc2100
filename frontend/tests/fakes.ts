import type { SocketLike } from '../src/ws';
import type { ApiPort } from '../src/chat';
import type { SocketPort } from '../src/protocol';
import type { AttachmentInfo, ClientFrame, Conversation, Message } from '../src/types';

/** A stand-in for the browser WebSocket, driven by the test. */
export class FakeSocket implements SocketLike {
  static all: FakeSocket[] = [];
  readyState = 0;
  sent: any[] = [];
  closedWith: number | undefined;
  onopen: ((ev: any) => any) | null = null;
  onclose: ((ev: any) => any) | null = null;
  onmessage: ((ev: any) => any) | null = null;
  onerror: ((ev: any) => any) | null = null;
  constructor(public url: string) {
    FakeSocket.all.push(this);
  }
  send(data: string) {
    if (this.readyState !== 1) throw new Error('not open');
    this.sent.push(JSON.parse(data));
  }
  close(code?: number) {
    this.closedWith = code;
    this.readyState = 3;
  }
  // test controls
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }
  receive(frame: unknown) {
    this.onmessage?.({ data: typeof frame === 'string' ? frame : JSON.stringify(frame) });
  }
  drop(code = 1006) {
    this.readyState = 3;
    this.onclose?.({ code });
  }
  static last(): FakeSocket {
    return FakeSocket.all[FakeSocket.all.length - 1];
  }
}

/** Socket port for store tests: records frames; `open` toggles connectivity. */
export class FakePort implements SocketPort {
  isOpen = true;
  sent: ClientFrame[] = [];
  queued: { key?: string; frame: ClientFrame }[] = [];
  send(frame: ClientFrame) {
    if (!this.isOpen) return false;
    this.sent.push(frame);
    return true;
  }
  sendWhenOpen(frame: ClientFrame, key?: string) {
    if (key) this.queued = this.queued.filter((q) => q.key !== key);
    if (this.send(frame)) return true;
    this.queued.push({ key, frame });
    return false;
  }
  unqueue(key: string) {
    this.queued = this.queued.filter((q) => q.key !== key);
  }
}

export function conv(id: number, title = 'Chat ' + id, updated = '2026-11-30T05:00:00Z'): Conversation {
  return { id, title, created_at: updated, updated_at: updated, settings: {} };
}

export function msg(p: Partial<Message> & { id: number; role: Message['role'] }): Message {
  return {
    conversation_id: 1,
    text: '',
    status: 'complete',
    finish_reason: 'stop',
    parent_id: null,
    created_at: '2026-11-30T05:00:00Z',
    figures: null,
    ...p,
  } as Message;
}

export class FakeApi implements ApiPort {
  convs = new Map<number, { conversation: Conversation; messages: Message[] }>();
  calls: [string, ...any[]][] = [];
  async list(q?: string) {
    this.calls.push(['list', q]);
    return { conversations: [...this.convs.values()].map((c) => c.conversation).filter((c) => !q || c.title.includes(q)) };
  }
  async get(id: number) {
    this.calls.push(['get', id]);
    const c = this.convs.get(id);
    if (!c) throw Object.assign(new Error('Not found'), { status: 404, code: 'not_found' });
    return structuredClone(c);
  }
  async patch(id: number, body: any) {
    this.calls.push(['patch', id, body]);
    const c = this.convs.get(id)!;
    if (body.title) c.conversation.title = body.title;
    if (body.settings) c.conversation.settings = body.settings;
    if (body.model) c.conversation.model = body.model;
    return c.conversation;
  }
  async remove(id: number) {
    this.calls.push(['remove', id]);
    this.convs.delete(id);
  }
  async engine() {
    return { model: 'test', max_model_len: 2048, speculative_modes: [], defaults: { temperature: 0.7, top_p: 0.9, max_tokens: 256 } };
  }
  // Documents (attachments.ts): an upload is "read" as its size in tokens, a file named
  // *.png is refused as the server refuses images; the count adds 10 tokens of words.
  docs = new Map<number, AttachmentInfo & { text: string }>();
  context = 100;
  async uploadAttachment(file: File) {
    this.calls.push(['upload', file.name]);
    if (file.name.endsWith('.png')) throw Object.assign(new Error(`${file.name} is an image.`), { status: 415, code: 'image_unsupported' });
    const text = await new Promise<string>((resolve) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result));
      reader.readAsText(file);
    });
    const info = { id: this.docs.size + 1, name: file.name, kind: 'text' as const, size: file.size, tokens: text.length, message_id: null };
    this.docs.set(info.id, { ...info, text });
    return info;
  }
  async attachment(id: number) {
    this.calls.push(['attachment', id]);
    const d = this.docs.get(id);
    if (!d) throw Object.assign(new Error('Not found'), { status: 404, code: 'not_found' });
    return d;
  }
  async removeAttachment(id: number) {
    this.calls.push(['removeAttachment', id]);
    this.docs.delete(id);
  }
  async promptSize(body: { conversation_id: number | null; text: string; attachments: number[] }) {
    this.calls.push(['promptSize', body]);
    const docs = body.attachments.map((id) => ({ id, tokens: this.docs.get(id)?.tokens ?? null }));
    const total = 10 + docs.reduce((n, d) => n + (d.tokens ?? 0), 0);
    const fits = total < this.context;
    return { prompt_tokens: total, context_tokens: this.context, fits, message: fits ? null : `This message needs ${total} tokens.`, attachments: docs };
  }
}

export const flush = () => new Promise((r) => setTimeout(r, 0));
