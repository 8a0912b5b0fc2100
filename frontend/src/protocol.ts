import { batch, signal } from '@preact/signals';
import type { Conversations, Result } from './conversations';
import { errorWords } from './errors';
import { announcementOf } from './format';
import { FALLBACK_LIMITS, withinLimits } from './limits';
import type { ServerInfo } from './server-info';
import type { AttachmentInfo, ClientFrame, Message, ServerFrame, Settings } from './types';
import type { ThreadKey, UiState } from './ui-state';
import type { ConnState } from './ws';

/** The part of ChatSocket (ws.ts) the protocol uses. */
export interface SocketPort {
  readonly isOpen: boolean;
  send(frame: ClientFrame): boolean;
  sendWhenOpen(frame: ClientFrame, key?: string): boolean;
  unqueue?(key: string): void;
}

interface PendingSend {
  thread: ThreadKey;
  localId: number;
  text: string;
  sentAt: number;
  docs: readonly AttachmentInfo[];
}

/** Where a refused send's documents go back to (the composer's, attachments.ts). */
export interface DraftDocuments {
  restore(key: ThreadKey, docs: readonly AttachmentInfo[]): void;
}

const now = () => (typeof performance !== 'undefined' ? performance.now() : Date.now());

/** Pure helper: the active branch after a `start` frame (see docs/websocket.md). */
export function threadAfterStart(
  thread: readonly number[],
  messages: ReadonlyMap<number, Message>,
  user: Message | null | undefined,
  reply: Message,
): number[] {
  const out = thread.filter((id) => id > 0 || !user); // drop optimistic messages once confirmed
  if (user) {
    const at = out.indexOf(user.id);
    if (at >= 0) return [...out.slice(0, at + 1), reply.id]; // regenerate: same user message
    const parent = user.parent_id;
    if (parent != null) {
      const p = out.indexOf(parent);
      if (p >= 0) return [...out.slice(0, p + 1), user.id, reply.id]; // send / edit: branch after the parent
    }
    if (parent == null) {
      // first message of a conversation, or an edit of the first message
      const first = out.length ? messages.get(out[0]) : undefined;
      if (!first || first.role !== 'system') return [user.id, reply.id];
      return [out[0], user.id, reply.id];
    }
    return [...out, user.id, reply.id];
  }
  // No user message in the frame: the reply replaces whatever follows its parent.
  if (reply.parent_id != null) {
    const p = out.indexOf(reply.parent_id);
    if (p >= 0) return [...out.slice(0, p + 1), reply.id];
  }
  return [...out, reply.id];
}

/** A new chat's settings as the send frame carries them: only the fields that are set. */
export function cleanSettings(s: Settings): Settings | undefined {
  const out: Settings = {};
  if (s.system_prompt && s.system_prompt.trim()) out.system_prompt = s.system_prompt;
  if (typeof s.temperature === 'number' && Number.isFinite(s.temperature)) out.temperature = s.temperature;
  if (typeof s.top_p === 'number' && Number.isFinite(s.top_p)) out.top_p = s.top_p;
  if (typeof s.max_tokens === 'number' && Number.isFinite(s.max_tokens)) out.max_tokens = Math.round(s.max_tokens);
  // Off is the server's default: only a chat that turns it on says so.
  if (s.json_mode === true) out.json_mode = true;
  return Object.keys(out).length ? out : undefined;
}

/**
 * The chat socket protocol (docs/websocket.md): server frames into conversation state,
 * the person's actions into client frames. It owns what only the protocol needs to know:
 * sends waiting for their `start`, stops asked before a reply had an id, and which
 * replies were already resumed on this connection.
 */
export class ChatProtocol {
  private readonly pendingSends = new Map<string, PendingSend>();
  private readonly pendingStops = new Set<string>();
  private readonly actionSentAt = new Map<number, number>();
  /** Resumes already sent on the current connection. */
  private readonly resumed = new Set<number>();
  private localSeq = 0;
  /** Compare: the model the next send also asks for an answer from (null: none). */
  readonly compareWith = signal<string | null>(null);
  /** Per conversation, the two replies of the comparison waiting for the user to keep one. */
  readonly comparisons = signal<ReadonlyMap<number, { first: number; second: number }>>(new Map());

  constructor(
    private readonly socket: SocketPort,
    private readonly conversations: Conversations,
    private readonly ui: UiState,
    private readonly server: ServerInfo,
    private readonly drafts?: DraftDocuments,
  ) {}

  // ------------------------------------------------------------------ connection
  setConn(state: ConnState): void {
    if (state !== 'open') this.forgetConnection();
    this.ui.setConn(state);
  }

  /** Called by the socket every time it opens. */
  onOpen(reconnected: boolean): void {
    this.forgetConnection();
    // "You are offline" is no longer true once the socket is open again.
    this.ui.clearNotices('offline');
    // The server deleted the temporary chats of the socket that closed (docs/websocket.md).
    if (reconnected && this.conversations.endTemporaries()) {
      this.ui.notify(null, 'The temporary chat ended when the connection dropped: it was not kept.', 'temporary_ended');
    }
    if (reconnected) this.catchUp();
    this.resumeStreaming();
  }

  /** Ask the server for every reply we believe is still being written and are not receiving. */
  resumeStreaming(): void {
    for (const m of this.conversations.messages.value.values()) {
      if (m.status === 'streaming' && m.id > 0 && !this.conversations.isReceiving(m.id) && !this.resumed.has(m.id)) {
        // Once per connection; a resume queued while offline is sent when the socket opens.
        if (this.socket.sendWhenOpen({ type: 'resume', message_id: m.id }, 'resume:' + m.id)) this.resumed.add(m.id);
      }
    }
  }

  private forgetConnection(): void {
    this.conversations.forgetReceiving();
    this.resumed.clear();
  }

  /** Back after a drop: reload what changed meanwhile and settle the sends that never got a `start`. */
  private catchUp(): void {
    const c = this.conversations;
    // Sends written before the drop may or may not have arrived.
    const unconfirmed = [...this.pendingSends.values()];
    this.pendingSends.clear();
    c.settle(null);
    c.refreshList().catch(() => undefined);
    const reload = new Set<number>();
    const current = c.currentId.value;
    if (current != null && c.isLoaded(current)) reload.add(current);
    for (const p of unconfirmed) if (typeof p.thread === 'number') reload.add(p.thread);
    const done = new Map<number, Promise<void>>();
    for (const id of reload) done.set(id, c.load(id, true).catch(() => undefined));
    for (const p of unconfirmed) {
      const settle = () => {
        const local = c.message(p.localId);
        if (!local) return;
        // The server saved it if the branch now ends with this text from the user.
        const saved = typeof p.thread === 'number' && c.thread(p.thread).some((id) => {
          const m = c.message(id);
          return id > 0 && m?.role === 'user' && m.text === p.text && (m.parent_id ?? null) === (local.parent_id ?? null);
        });
        if (saved) c.removeFromThread(p.thread, p.localId);
        else this.failSend(p, 'The connection dropped before the server confirmed this message. It is back in the box — check the conversation and send it again if needed.');
      };
      const wait = typeof p.thread === 'number' ? done.get(p.thread) : undefined;
      if (wait) wait.then(settle);
      else settle();
    }
  }

  // ------------------------------------------------------------------ frames
  handleFrame(f: ServerFrame): void {
    batch(() => {
      switch (f.type) {
        case 'conversation':
          return this.onConversation(f);
        case 'start':
          return this.onStart(f);
        case 'delta':
          return this.onDelta(f);
        case 'snapshot':
          return this.onSnapshot(f.message);
        case 'done':
          return this.onDone(f);
        case 'title':
          return this.onTitle(f);
        case 'error':
          return this.onError(f);
        default:
          return;
      }
    });
  }

  private onConversation({ conversation }: Extract<ServerFrame, { type: 'conversation' }>): void {
    this.conversations.upsert(conversation, true);
    if ([...this.pendingSends.values()].some((p) => p.thread === 'new')) this.bindNew(conversation.id);
  }

  private bindNew(id: number): void {
    this.conversations.bindNew(id);
    for (const p of this.pendingSends.values()) if (p.thread === 'new') p.thread = id;
  }

  private onStart(f: Extract<ServerFrame, { type: 'start' }>): void {
    const c = this.conversations;
    const convId = f.conversation_id;
    if (typeof f.compare_to === 'number') {
      // The second answer of a comparison: beside the first, not in the thread.
      c.putMessage({ ...f.message, conversation_id: convId, status: 'streaming', text: f.message.text || '' });
      c.receive(f.message.id);
      this.comparisons.value = new Map(this.comparisons.value).set(convId, { first: f.compare_to, second: f.message.id });
      return;
    }
    const pending = f.client_id ? this.pendingSends.get(f.client_id) : undefined;
    if (pending && pending.thread === 'new') this.bindNew(convId);
    if (f.client_id) this.pendingSends.delete(f.client_id);
    c.settle(convId);

    const thread = c.thread(convId);
    const user = f.user_message || undefined;
    const reply: Message = { ...f.message, conversation_id: convId, status: 'streaming', text: f.message.text || '' };
    const sentAt = pending?.sentAt ?? (this.actionSentAt.get(convId) || undefined);
    this.actionSentAt.delete(convId);
    if (sentAt !== undefined) reply.client_sent_at = sentAt;
    const nextThread = threadAfterStart(thread, c.messages.value, user, reply);

    // Keep the replaced message as a local alternative until the server's list comes in.
    const pos = nextThread.indexOf(reply.id);
    const replaced = thread[pos] !== undefined ? c.message(thread[pos]) : undefined;
    if (!reply.alternatives?.length && replaced && replaced.role === 'assistant' && replaced.id !== reply.id && replaced.id > 0 && thread[pos - 1] === nextThread[pos - 1]) {
      const alts = [...(replaced.alternatives?.length ? replaced.alternatives : [replaced.id]), reply.id];
      reply.alternatives = alts;
      reply.alternative_index = alts.length - 1;
    }
    if (user) {
      const upos = nextThread.indexOf(user.id);
      const oldUser = thread[upos] !== undefined ? c.message(thread[upos]) : undefined;
      const u: Message = { ...user, conversation_id: convId };
      if (!u.alternatives?.length && oldUser && oldUser.role === 'user' && oldUser.id !== user.id && oldUser.id > 0) {
        const alts = [...(oldUser.alternatives?.length ? oldUser.alternatives : [oldUser.id]), user.id];
        u.alternatives = alts;
        u.alternative_index = alts.length - 1;
      }
      c.putMessage(u);
    }
    if (pending) c.dropMessage(pending.localId);
    c.putMessage(reply);
    c.setThread(convId, nextThread);
    c.receive(reply.id);

    const conv = c.conversation(convId);
    if (conv) c.upsert({ ...conv, updated_at: reply.created_at || new Date().toISOString() }, true);

    if (f.client_id && this.pendingStops.delete(f.client_id)) {
      this.socket.sendWhenOpen({ type: 'stop', message_id: reply.id }, 'stop:' + reply.id);
    }
  }

  private onDelta({ message_id: id, text, seq }: Extract<ServerFrame, { type: 'delta' }>): void {
    const m = this.conversations.message(id);
    if (!m || typeof text !== 'string' || !text) return;
    // Deltas carry the sequence number of their last token: one we already have is a repeat.
    if (typeof seq === 'number' && typeof m.seq === 'number' && seq <= m.seq) return;
    this.conversations.putMessage({
      ...m,
      text: m.text + text,
      status: m.status === 'sending' ? 'streaming' : m.status,
      seq: typeof seq === 'number' ? seq : m.seq,
    });
    this.conversations.receive(id);
  }

  private onSnapshot(msg: Message): void {
    const c = this.conversations;
    const old = c.message(msg.id);
    c.putMessage({ ...(old || {}), ...msg, alternatives: msg.alternatives ?? old?.alternatives, alternative_index: msg.alternative_index ?? old?.alternative_index });
    if (msg.status === 'streaming') c.receive(msg.id);
    else c.stopReceiving(msg.id);
    const key = msg.conversation_id;
    if (key != null && c.hasThread(key) && !c.thread(key).includes(msg.id)) c.setThread(key, [...c.thread(key), msg.id]);
  }

  private onDone(f: Extract<ServerFrame, { type: 'done' }>): void {
    const c = this.conversations;
    const old = c.message(f.message_id);
    c.stopReceiving(f.message_id);
    this.socket.unqueue?.('stop:' + f.message_id);
    if (!old && !f.message) return;
    const base: Message = { ...(old as Message), ...(f.message || {}) };
    const m: Message = {
      ...base,
      alternatives: f.message?.alternatives ?? old?.alternatives,
      alternative_index: f.message?.alternative_index ?? old?.alternative_index,
      status: f.status || base.status,
      finish_reason: f.finish_reason ?? base.finish_reason,
      figures: f.figures ?? base.figures,
    };
    if (f.status === 'error' && !this.ui.noticesFor(m.conversation_id ?? 'new').length) m.error = errorWords('engine_error');
    c.putMessage(m);
    // A reply this page watched being written, in the conversation on screen: say it once.
    if (old?.status === 'streaming' && m.status !== 'streaming' && m.conversation_id === c.currentId.value) this.ui.announce(announcementOf(m));
    // Pull the server's view of the branch (ids of alternatives) when something branched.
    const convId = m.conversation_id;
    if (convId != null && (m.alternatives?.length ?? 0) > 1) c.load(convId, true).catch(() => undefined);
  }

  private onTitle({ conversation_id: id, title }: Extract<ServerFrame, { type: 'title' }>): void {
    const c = this.conversations.conversation(id);
    const at = new Date().toISOString();
    this.conversations.upsert(c ? { ...c, title } : { id, title, created_at: at, updated_at: at });
  }

  private onError(f: Extract<ServerFrame, { type: 'error' }>): void {
    const c = this.conversations;
    const words = errorWords(f.code, f.message);
    let key: ThreadKey | null = null;
    const pending = f.client_id ? this.pendingSends.get(f.client_id) : undefined;
    if (f.client_id && pending) {
      this.pendingSends.delete(f.client_id);
      this.pendingStops.delete(f.client_id);
      this.failSend(pending, null);
      key = pending.thread;
    }
    if (f.message_id != null) {
      const m = c.message(f.message_id);
      if (m) {
        key = key ?? m.conversation_id ?? null;
        if (m.status === 'streaming' && f.code !== 'already_streaming' && f.code !== 'engine_error') {
          c.putMessage({ ...m, status: 'error', error: words });
          c.stopReceiving(m.id);
        }
      }
    }
    if (key == null && f.conversation_id != null) key = f.conversation_id;
    if (key == null && f.client_id) key = c.currentKey.value;
    if (key == null) {
      // A regenerate/edit was refused (errors for those frames name no conversation).
      const waiting = c.anyAwaiting();
      if (waiting !== undefined) {
        key = waiting;
        c.settle(null);
      }
    }
    if (typeof key === 'number') c.settle(key);
    this.ui.notify(key, words, f.code);
  }

  /** A send that did not go through: drop the optimistic message and put the text back. */
  private failSend(p: PendingSend, note: string | null): void {
    batch(() => {
      this.conversations.removeFromThread(p.thread, p.localId);
      const draft = this.ui.getDraft(p.thread);
      this.ui.setDraft(p.thread, draft ? (draft.includes(p.text) ? draft : p.text + '\n\n' + draft) : p.text, true);
      this.drafts?.restore(p.thread, p.docs);
      if (note) this.ui.notify(p.thread, note, 'not_confirmed');
    });
  }

  // ------------------------------------------------------------------ compare
  /** Keep one answer of a comparison: the first is already the thread's; the second becomes it. */
  async keepCompared(convId: number, messageId: number): Promise<Result> {
    const cmp = this.comparisons.value.get(convId);
    if (!cmp) return { ok: false };
    const r = messageId === cmp.first ? { ok: true } : await this.conversations.selectMessage(convId, messageId);
    if (r.ok) this.dropComparison(convId);
    return r;
  }

  private dropComparison(convId: number): void {
    if (!this.comparisons.value.has(convId)) return;
    const next = new Map(this.comparisons.value);
    next.delete(convId);
    this.comparisons.value = next;
  }

  // ------------------------------------------------------------------ actions
  /** Send the person's words, after their documents (`docs`, already uploaded); a message may be its documents alone. */
  sendMessage(text: string, docs: readonly AttachmentInfo[] = []): Result {
    const c = this.conversations;
    const body = text.trim();
    const key = c.currentKey.value;
    if (!body && !docs.length) return { ok: false };
    if (!this.socket.isOpen) return this.refuse(key, this.ui.conn.value === 'unauthorized' ? 'unauthorized' : 'offline', 'offline');
    const limit = this.server.maxMessageChars;
    if (limit && body.length > limit) {
      const n = (x: number) => x.toLocaleString('en-US');
      const error = `This message is too long to send: ${n(body.length)} characters, and the limit is ${n(limit)}. Please shorten it or send it in parts.`;
      this.ui.notify(key, error, 'message_too_long');
      return { ok: false, error };
    }
    if (c.isBusy(key)) return this.refuse(key, 'already_streaming');
    const clientId = 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
    const currentId = c.currentId.value;
    const frame: ClientFrame = { type: 'send', conversation_id: currentId, text: body, client_id: clientId };
    if (docs.length) frame.attachments = docs.map((d) => d.id);
    const model = this.modelFor(currentId);
    if (model) frame.model = model;
    const other = this.compareWith.value;
    if (other && other !== model) frame.compare_model = other;
    if (currentId == null) {
      // Never send a value the server would refuse (it then uses its default for it).
      const s = withinLimits(cleanSettings(c.draftSettings.value), this.server.limits.value ?? FALLBACK_LIMITS);
      if (s) frame.settings = s;
      if (c.temporaryMode.value) frame.temporary = true;
    }
    if (!this.socket.send(frame)) return this.refuse(key, 'offline');
    // A comparison is for one prompt; sending on keeps the first answer.
    this.compareWith.value = null;
    if (currentId != null) this.dropComparison(currentId);
    const localId = -++this.localSeq;
    const thread = c.thread(key);
    const last = thread.length ? thread[thread.length - 1] : null;
    batch(() => {
      c.putMessage({ id: localId, conversation_id: currentId, role: 'user', text: body, status: 'sending', parent_id: last, client_id: clientId, attachments: [...docs] });
      c.setThread(key, [...thread, localId]);
      this.ui.setDraft(key, '');
      this.ui.clearThread(key);
    });
    this.pendingSends.set(clientId, { thread: key, localId, text: body, sentAt: now(), docs });
    return { ok: true };
  }

  /** Stop the reply being written in a thread (the current one by default), and the
   * second answer of a comparison there, which streams beside the thread. */
  stop(key: ThreadKey = this.conversations.currentKey.value): boolean {
    const m = this.conversations.streamingIn(key);
    const cmp = key === 'new' ? undefined : this.comparisons.value.get(key);
    const second = cmp ? this.conversations.message(cmp.second) : undefined;
    const secondStreaming = second?.status === 'streaming' ? second : undefined;
    if (!m && !secondStreaming) return false;
    // Offline the Stop button is off (paused.ts); Escape is refused the same way rather
    // than queueing a stop that would land after the reply resumed or finished.
    if (!this.socket.isOpen) return false;
    if (secondStreaming) {
      this.socket.sendWhenOpen({ type: 'stop', message_id: secondStreaming.id }, 'stop:' + secondStreaming.id);
    }
    if (!m) return true;
    if (m.status === 'streaming' && m.id > 0) {
      this.socket.sendWhenOpen({ type: 'stop', message_id: m.id }, 'stop:' + m.id);
      return true;
    }
    if (m.status === 'sending' && m.client_id) {
      this.pendingStops.add(m.client_id);
      return true;
    }
    return false;
  }

  regenerate(messageId: number): Result {
    return this.action({ type: 'regenerate', message_id: messageId, ...this.modelField(messageId) }, messageId);
  }

  /** Write on a reply cut at its length limit, in place (the server reuses its KV cache). */
  continueReply(messageId: number): Result {
    return this.action({ type: 'continue', message_id: messageId }, messageId);
  }

  /** Edit and resend a message; it keeps its documents (the server copies them onto the new version). */
  edit(messageId: number, text: string): Result {
    const body = text.trim();
    if (!body && !this.conversations.message(messageId)?.attachments?.length) return { ok: false };
    return this.action({ type: 'edit', message_id: messageId, text: body, ...this.modelField(messageId) }, messageId);
  }

  /** The model a turn in conversation `id` names: the picker's (none while unknown). */
  private modelFor(id: number | null): string | undefined {
    return this.conversations.modelOf(id, this.server.defaultModel.value);
  }

  private modelField(messageId: number): { model?: string } {
    const id = this.conversations.message(messageId)?.conversation_id ?? this.conversations.currentId.value;
    const model = this.modelFor(id);
    return model ? { model } : {};
  }

  private action(frame: ClientFrame, messageId: number): Result {
    const c = this.conversations;
    const convId = c.message(messageId)?.conversation_id ?? c.currentId.value;
    const key: ThreadKey = convId ?? 'new';
    if (!this.socket.isOpen) {
      const error = errorWords('offline').replace(', so the message was not sent. It is still in the box — send it again', '. Try again');
      this.ui.notify(key, error, 'offline');
      return { ok: false, error };
    }
    if (c.isBusy(key)) return this.refuse(key, 'already_streaming');
    if (!this.socket.send(frame)) return { ok: false, error: errorWords('offline') };
    batch(() => {
      if (convId != null) {
        c.await(convId);
        this.actionSentAt.set(convId, now());
      }
      this.ui.clearThread(key);
    });
    return { ok: true };
  }

  private refuse(key: ThreadKey, code: string, noticeCode: string = code): Result {
    const error = errorWords(code);
    this.ui.notify(key, error, noticeCode);
    return { ok: false, error };
  }
}
