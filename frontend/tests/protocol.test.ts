import { effect } from '@preact/signals';
import { beforeEach, describe, expect, it } from 'vitest';
import { createChat } from '../src/chat';
import type { Conversations } from '../src/conversations';
import { threadAfterStart, type ChatProtocol } from '../src/protocol';
import type { ServerInfo } from '../src/server-info';
import type { Message } from '../src/types';
import type { UiState } from '../src/ui-state';
import { conv, FakeApi, FakePort, flush, msg } from './fakes';

let port: FakePort;
let api: FakeApi;
let conversations: Conversations;
let protocol: ChatProtocol;
let ui: UiState;
let server: ServerInfo;

function setUp(withApi: FakeApi = new FakeApi()) {
  port = new FakePort();
  api = withApi;
  ({ conversations, protocol, ui, server } = createChat(port, api));
  protocol.setConn('open');
}

beforeEach(() => setUp());

function startNew(text = 'What is the capital of France?') {
  expect(protocol.sendMessage(text).ok).toBe(true);
  const f = port.sent[port.sent.length - 1] as any;
  return f.client_id as string;
}

describe('sending and streaming', () => {
  it('sends a new conversation, binds it, and appends deltas in order', () => {
    const cid = startNew();
    expect(port.sent[0]).toMatchObject({ type: 'send', conversation_id: null, text: 'What is the capital of France?' });
    // optimistic user message shows at once
    const t0 = conversations.thread('new');
    expect(t0).toHaveLength(1);
    expect(conversations.message(t0[0])!.status).toBe('sending');

    protocol.handleFrame({ type: 'conversation', conversation: conv(7, 'What is the capital of France?') });
    expect(conversations.currentId.value).toBe(7);
    expect(conversations.list.value[0].id).toBe(7);
    protocol.handleFrame({
      type: 'start',
      conversation_id: 7,
      client_id: cid,
      user_message: msg({ id: 14, role: 'user', conversation_id: 7, text: 'What is the capital of France?' }),
      message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 14 }),
    });
    expect(conversations.thread(7)).toEqual([14, 15]);
    protocol.handleFrame({ type: 'delta', message_id: 15, text: 'The capital' });
    protocol.handleFrame({ type: 'delta', message_id: 15, text: ' of France' });
    protocol.handleFrame({ type: 'delta', message_id: 15, text: ' is Paris.' });
    expect(conversations.message(15)!.text).toBe('The capital of France is Paris.');
    expect(conversations.streamingIn(7)!.id).toBe(15);
    protocol.handleFrame({
      type: 'done', message_id: 15, status: 'complete', finish_reason: 'stop',
      figures: { ttft_ms: 84.2, output_tokens: 8, tokens_per_s: 41.7, prompt_tokens: 31, cached_tokens: 0 },
    });
    const m = conversations.message(15)!;
    expect(m.status).toBe('complete');
    expect(m.figures!.ttft_ms).toBe(84.2);
    expect(conversations.isBusy(7)).toBe(false);
  });

  it('applies each frame as one change, so a view never sees half of a start', () => {
    const cid = startNew('hi');
    protocol.handleFrame({ type: 'conversation', conversation: conv(7) });
    const seen: [number[], string | undefined][] = [];
    const stop = effect(() => {
      const t = conversations.thread(7);
      seen.push([[...t], conversations.message(t[t.length - 1])?.status]);
    });
    seen.length = 0;
    protocol.handleFrame({
      type: 'start', conversation_id: 7, client_id: cid,
      user_message: msg({ id: 14, role: 'user', conversation_id: 7, text: 'hi' }),
      message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 14 }),
    });
    for (const piece of ['a', 'b']) protocol.handleFrame({ type: 'delta', message_id: 15, text: piece });
    stop();
    // One run per frame, each seeing a whole state: the optimistic message already replaced.
    expect(seen).toEqual([[[14, 15], 'streaming'], [[14, 15], 'streaming'], [[14, 15], 'streaming']]);
    expect(conversations.message(15)!.text).toBe('ab');
  });

  it('ignores deltas for unknown messages and empty deltas', () => {
    protocol.handleFrame({ type: 'delta', message_id: 99, text: 'x' });
    expect(conversations.message(99)).toBeUndefined();
    conversations.apply(conv(1), [msg({ id: 2, role: 'assistant', status: 'streaming', text: 'a' })]);
    const before = conversations.message(2);
    protocol.handleFrame({ type: 'delta', message_id: 2, text: '' });
    expect(conversations.message(2)).toBe(before);
  });

  it('replaces message objects instead of mutating them (so views can compare)', () => {
    conversations.apply(conv(1), [msg({ id: 2, role: 'assistant', status: 'streaming', text: 'a' })]);
    const a = conversations.message(2)!;
    protocol.handleFrame({ type: 'delta', message_id: 2, text: 'b' });
    expect(a.text).toBe('a');
    expect(conversations.message(2)).not.toBe(a);
  });

  it('refuses to send while offline and keeps the text', () => {
    port.isOpen = false;
    protocol.setConn('reconnecting');
    const r = protocol.sendMessage('hello');
    expect(r.ok).toBe(false);
    expect(r.error).toMatch(/offline/i);
    expect(port.sent).toHaveLength(0);
    expect(conversations.thread('new')).toHaveLength(0);
    expect(ui.noticesFor('new')[0].code).toBe('offline');
  });

  it('refuses a message over the server\'s length limit, in words, before sending it', async () => {
    const short = new FakeApi();
    short.engine = async () => ({ model: 't', max_model_len: 2048, speculative_modes: [], defaults: { temperature: 0.7, top_p: 0.9, max_tokens: 256 }, max_message_chars: 10 });
    setUp(short);
    await server.loadEngine();
    const r = protocol.sendMessage('x'.repeat(11));
    expect(r.ok).toBe(false);
    expect(r.error).toMatch(/too long.*11 characters.*limit is 10/);
    expect(port.sent).toHaveLength(0);
    expect(conversations.thread('new')).toHaveLength(0);
    expect(ui.noticesFor('new')[0].code).toBe('message_too_long');
    expect(protocol.sendMessage('x'.repeat(10)).ok).toBe(true);
  });

  it('refuses a second send while a reply is streaming', () => {
    conversations.apply(conv(1), [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', status: 'streaming', parent_id: 1 })]);
    void conversations.select(1);
    expect(protocol.sendMessage('again').ok).toBe(false);
    expect(port.sent.filter((f) => f.type === 'send')).toHaveLength(0);
  });

  it('stop sends the message id; a stop before start waits for the start', () => {
    const cid = startNew('hi');
    expect(protocol.stop()).toBe(true);
    expect(port.sent.filter((f) => f.type === 'stop')).toHaveLength(0);
    protocol.handleFrame({ type: 'conversation', conversation: conv(3) });
    protocol.handleFrame({
      type: 'start', conversation_id: 3, client_id: cid,
      user_message: msg({ id: 10, role: 'user', conversation_id: 3 }),
      message: msg({ id: 11, role: 'assistant', conversation_id: 3, status: 'streaming', parent_id: 10 }),
    });
    expect(port.sent[port.sent.length - 1]).toEqual({ type: 'stop', message_id: 11 });
    protocol.handleFrame({ type: 'done', message_id: 11, status: 'stopped', finish_reason: 'abort', figures: { output_tokens: 2 } });
    expect(conversations.message(11)!.status).toBe('stopped');
  });
});

describe('errors', () => {
  it('puts the text back and shows plain words when a send is rejected', () => {
    const cid = startNew('too much');
    protocol.handleFrame({ type: 'error', code: 'busy', message: 'queue full', client_id: cid });
    expect(conversations.thread('new')).toHaveLength(0);
    expect(ui.getDraft('new')).toBe('too much');
    const n = ui.noticesFor('new');
    expect(n[0].text).toMatch(/busy/i);
    expect(n[0].text).not.toContain('queue full');
  });

  it('marks a streaming message as failed when its resume is not found', () => {
    conversations.apply(conv(1), [msg({ id: 5, role: 'assistant', status: 'streaming', text: 'part' })]);
    protocol.handleFrame({ type: 'error', code: 'not_found', message: 'x', message_id: 5 });
    expect(conversations.message(5)!.status).toBe('error');
    expect(ui.noticesFor(1)).toHaveLength(1);
  });

  it('shows frame errors without context as toasts', () => {
    protocol.handleFrame({ type: 'error', code: 'bad_frame', message: 'unknown type' });
    expect(ui.toasts.value).toHaveLength(1);
    ui.dismiss(ui.toasts.value[0].id);
    expect(ui.toasts.value).toHaveLength(0);
  });

  it('uses the server sentence for invalid values', () => {
    protocol.handleFrame({ type: 'error', code: 'invalid', message: 'Temperature must be between 0 and 2.', conversation_id: 4 });
    expect(ui.noticesFor(4)[0].text).toBe('Temperature must be between 0 and 2.');
  });
});

describe('reconnect and resume', () => {
  it('resumes streaming messages from a page load once open, and on reconnect', async () => {
    port.isOpen = false;
    protocol.setConn('connecting');
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', status: 'streaming', text: 'Half', parent_id: 1 })] });
    await conversations.select(1);
    expect(port.queued.map((q) => q.frame)).toEqual([{ type: 'resume', message_id: 2 }]);
    port.isOpen = true;
    protocol.setConn('open');
    protocol.onOpen(false);
    expect(port.sent).toEqual([{ type: 'resume', message_id: 2 }]);
    protocol.handleFrame({ type: 'snapshot', message: msg({ id: 2, role: 'assistant', status: 'streaming', text: 'Half a rep', parent_id: 1 }) });
    protocol.handleFrame({ type: 'delta', message_id: 2, text: 'ly' });
    expect(conversations.message(2)!.text).toBe('Half a reply');
    // connection drops mid-reply, comes back: resume again, snapshot replaces the text
    port.isOpen = false;
    protocol.setConn('reconnecting');
    port.isOpen = true;
    port.sent = [];
    protocol.setConn('open');
    protocol.onOpen(true);
    expect(port.sent).toContainEqual({ type: 'resume', message_id: 2 });
    protocol.handleFrame({ type: 'snapshot', message: msg({ id: 2, role: 'assistant', status: 'complete', text: 'Half a reply, done.', parent_id: 1 }) });
    expect(conversations.message(2)!.text).toBe('Half a reply, done.');
    expect(conversations.message(2)!.status).toBe('complete');
    await flush();
  });

  it('does not resume a reply it is already receiving live', () => {
    const cid = startNew('x');
    protocol.handleFrame({ type: 'conversation', conversation: conv(2) });
    protocol.handleFrame({ type: 'start', conversation_id: 2, client_id: cid, user_message: msg({ id: 3, role: 'user', conversation_id: 2 }), message: msg({ id: 4, role: 'assistant', conversation_id: 2, status: 'streaming', parent_id: 3 }) });
    protocol.handleFrame({ type: 'delta', message_id: 4, text: 'abc' });
    conversations.apply(conv(2), [msg({ id: 3, role: 'user', conversation_id: 2 }), msg({ id: 4, role: 'assistant', conversation_id: 2, status: 'streaming', text: 'a', parent_id: 3 })]);
    expect(port.sent.filter((f) => f.type === 'resume')).toHaveLength(0);
    expect(conversations.message(4)!.text).toBe('abc'); // the database's shorter text does not win
  });

  it('gives a send back to the composer when the connection dropped before it was confirmed', () => {
    startNew('lost?');
    protocol.setConn('reconnecting');
    protocol.onOpen(true);
    expect(conversations.thread('new')).toHaveLength(0);
    expect(ui.getDraft('new')).toBe('lost?');
    expect(ui.noticesFor('new')[0].code).toBe('not_confirmed');
  });
});

describe('branches', () => {
  const base = (): Message[] => [
    msg({ id: 1, role: 'user', text: 'q1' }),
    msg({ id: 2, role: 'assistant', text: 'a1', parent_id: 1 }),
    msg({ id: 3, role: 'user', text: 'q2', parent_id: 2 }),
    msg({ id: 4, role: 'assistant', text: 'a2', parent_id: 3 }),
  ];

  it('regenerate replaces the reply and keeps the old one as an alternative', () => {
    conversations.apply(conv(1), base());
    void conversations.select(1);
    expect(protocol.regenerate(4).ok).toBe(true);
    expect(port.sent.at(-1)).toEqual({ type: 'regenerate', message_id: 4 });
    expect(conversations.isBusy(1)).toBe(true);
    protocol.handleFrame({ type: 'start', conversation_id: 1, user_message: base()[2], message: msg({ id: 5, role: 'assistant', status: 'streaming', parent_id: 3 }) });
    expect(conversations.thread(1)).toEqual([1, 2, 3, 5]);
    expect(conversations.message(5)!.alternatives).toEqual([4, 5]);
    expect(conversations.message(5)!.alternative_index).toBe(1);
  });

  it('continue writes the same reply on in place: its text so far, then the new deltas', () => {
    const cut = [...base().slice(0, 3), msg({ id: 4, role: 'assistant', text: 'Once upon', parent_id: 3, finish_reason: 'length', seq: 9 })];
    conversations.apply(conv(1), cut);
    void conversations.select(1);
    expect(protocol.continueReply(4).ok).toBe(true);
    expect(port.sent.at(-1)).toEqual({ type: 'continue', message_id: 4 });
    protocol.handleFrame({ type: 'start', conversation_id: 1, user_message: null, message: msg({ id: 4, role: 'assistant', text: 'Once upon', status: 'streaming', parent_id: 3 }) });
    protocol.handleFrame({ type: 'delta', message_id: 4, text: ' a time', seq: 1 });
    expect(conversations.thread(1)).toEqual([1, 2, 3, 4]);
    expect(conversations.message(4)!.text).toBe('Once upon a time');
    expect(conversations.message(4)!.alternatives ?? []).toEqual([]);
  });

  it('edit branches after the parent of the edited message', () => {
    conversations.apply(conv(1), base());
    void conversations.select(1);
    expect(protocol.edit(1, 'q1 edited').ok).toBe(true);
    expect(port.sent.at(-1)).toEqual({ type: 'edit', message_id: 1, text: 'q1 edited' });
    protocol.handleFrame({ type: 'start', conversation_id: 1, user_message: msg({ id: 6, role: 'user', text: 'q1 edited', parent_id: null }), message: msg({ id: 7, role: 'assistant', status: 'streaming', parent_id: 6 }) });
    expect(conversations.thread(1)).toEqual([6, 7]);
    expect(conversations.message(6)!.alternatives).toEqual([1, 6]);
  });

  it('threadAfterStart handles a plain send and a mid-conversation edit', () => {
    const map = new Map(base().map((m) => [m.id, m]));
    expect(threadAfterStart([1, 2, 3, 4, -1], map, msg({ id: 8, role: 'user', parent_id: 4 }), msg({ id: 9, role: 'assistant', parent_id: 8 }))).toEqual([1, 2, 3, 4, 8, 9]);
    expect(threadAfterStart([1, 2, 3, 4], map, msg({ id: 8, role: 'user', parent_id: 2 }), msg({ id: 9, role: 'assistant', parent_id: 8 }))).toEqual([1, 2, 8, 9]);
    expect(threadAfterStart([1, 2, 3, 4], map, null, msg({ id: 9, role: 'assistant', parent_id: 3 }))).toEqual([1, 2, 3, 9]);
  });

  it('flips alternatives with PATCH active_message and reloads the branch', async () => {
    const msgs = base();
    msgs[3] = { ...msgs[3], alternatives: [4, 5], alternative_index: 0 };
    api.convs.set(1, { conversation: conv(1), messages: msgs });
    conversations.apply(conv(1), msgs);
    expect((await conversations.showAlternative(4, 1)).ok).toBe(true);
    expect(api.calls).toContainEqual(['patch', 1, { active_message: 5 }]);
    expect(api.calls.at(-1)).toEqual(['get', 1]);
    expect((await conversations.showAlternative(4, -1)).ok).toBe(false); // already the first
  });
});

describe('server details', () => {
  it('drops a repeated delta by its sequence number after a snapshot', () => {
    conversations.apply(conv(1), [msg({ id: 2, role: 'assistant', status: 'streaming', text: '' })]);
    protocol.handleFrame({ type: 'snapshot', message: { ...msg({ id: 2, role: 'assistant', status: 'streaming', text: 'abc' }), seq: 3 } });
    protocol.handleFrame({ type: 'delta', message_id: 2, text: 'c', seq: 3 });
    protocol.handleFrame({ type: 'delta', message_id: 2, text: 'de', seq: 5 });
    expect(conversations.message(2)!.text).toBe('abcde');
  });

  it('regenerate with user_message null still replaces the reply', () => {
    conversations.apply(conv(1), [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', parent_id: 1 })]);
    void conversations.select(1);
    protocol.regenerate(2);
    protocol.handleFrame({ type: 'start', conversation_id: 1, user_message: null, message: msg({ id: 3, role: 'assistant', status: 'streaming', parent_id: 1, alternatives: [2, 3], alternative_index: 1 }) });
    expect(conversations.thread(1)).toEqual([1, 3]);
    expect(conversations.message(3)!.alternatives).toEqual([2, 3]);
  });

  it('accepts a PATCH answer that carries the branch', async () => {
    const msgs = [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', parent_id: 1, alternatives: [2, 3], alternative_index: 0 })];
    conversations.apply(conv(1), msgs);
    (api as any).patch = async (id: number, body: any) => {
      api.calls.push(['patch', id, body]);
      return { conversation: conv(1), messages: [msgs[0], msg({ id: 3, role: 'assistant', parent_id: 1, text: 'other', alternatives: [2, 3], alternative_index: 1 })] };
    };
    expect((await conversations.showAlternative(2, 1)).ok).toBe(true);
    expect(conversations.thread(1)).toEqual([1, 3]);
    expect(api.calls.filter((c) => c[0] === 'get')).toHaveLength(0);
    await conversations.rename(1, 'New name');
    expect(conversations.conversation(1)!.title).toBe('Chat 1'); // the answer's conversation wins
    expect((conversations.conversation(1) as any).messages).toBeUndefined();
  });

});

describe('unconfirmed sends after a reconnect', () => {
  it('drops the local copy quietly when the server did save the message', async () => {
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', parent_id: 1, text: 'a' })] });
    await conversations.select(1);
    startNew('follow-up');
    // the server got it and is streaming the reply; the socket dropped before `start` arrived
    api.convs.get(1)!.messages.push(msg({ id: 3, role: 'user', text: 'follow-up', parent_id: 2 }), msg({ id: 4, role: 'assistant', status: 'streaming', text: 'Par', parent_id: 3 }));
    port.sent = [];
    protocol.setConn('reconnecting');
    protocol.setConn('open');
    protocol.onOpen(true);
    await flush();
    await flush();
    expect(conversations.thread(1)).toEqual([1, 2, 3, 4]);
    expect(ui.getDraft(1)).toBe('');
    expect(ui.noticesFor(1)).toHaveLength(0);
    expect(port.sent).toContainEqual({ type: 'resume', message_id: 4 });
  });

  it('gives the text back when the server did not save it', async () => {
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', parent_id: 1, text: 'a' })] });
    await conversations.select(1);
    startNew('lost words');
    protocol.setConn('reconnecting');
    protocol.setConn('open');
    protocol.onOpen(true);
    await flush();
    await flush();
    expect(conversations.thread(1)).toEqual([1, 2]);
    expect(ui.getDraft(1)).toBe('lost words');
    expect(ui.noticesFor(1)[0].code).toBe('not_confirmed');
  });
});

describe('refused actions', () => {
  it('an error for a refused regenerate clears the busy state and shows in the conversation', () => {
    conversations.apply(conv(1), [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', parent_id: 1 })]);
    void conversations.select(1);
    protocol.regenerate(2);
    expect(conversations.isBusy(1)).toBe(true);
    protocol.handleFrame({ type: 'error', code: 'busy', message: 'full' });
    expect(conversations.isBusy(1)).toBe(false);
    expect(ui.noticesFor(1)[0].code).toBe('busy');
  });

  it('records when the person pressed send on the reply (for the TTFT they see)', () => {
    const cid = startNew('hi');
    protocol.handleFrame({ type: 'conversation', conversation: conv(2) });
    protocol.handleFrame({ type: 'start', conversation_id: 2, client_id: cid, user_message: msg({ id: 3, role: 'user', conversation_id: 2 }), message: msg({ id: 4, role: 'assistant', conversation_id: 2, status: 'streaming', parent_id: 3 }) });
    expect(typeof conversations.message(4)!.client_sent_at).toBe('number');
  });
});

describe('resume once per connection', () => {
  it('does not ask twice before the snapshot arrives', async () => {
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', status: 'streaming', parent_id: 1 })] });
    await conversations.select(1);
    await conversations.load(1, true); // e.g. the catch-up reload after a reconnect
    expect(port.sent.filter((f) => f.type === 'resume')).toHaveLength(1);
    protocol.setConn('reconnecting');
    protocol.setConn('open');
    protocol.onOpen(true);
    await flush();
    expect(port.sent.filter((f) => f.type === 'resume')).toHaveLength(2);
  });
});
