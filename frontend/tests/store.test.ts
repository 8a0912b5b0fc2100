import { beforeEach, describe, expect, it } from 'vitest';
import { Store, threadAfterStart } from '../src/store';
import type { Message } from '../src/types';
import { conv, FakeApi, FakePort, flush, msg } from './fakes';

let port: FakePort;
let api: FakeApi;
let store: Store;
let notified = 0;

beforeEach(() => {
  port = new FakePort();
  api = new FakeApi();
  notified = 0;
  store = new Store(port, api, (fn) => fn());
  store.subscribe(() => notified++);
  store.setConn('open');
});

function startNew(text = 'What is the capital of France?') {
  expect(store.sendMessage(text).ok).toBe(true);
  const f = port.sent[port.sent.length - 1] as any;
  return f.client_id as string;
}

describe('sending and streaming', () => {
  it('sends a new conversation, binds it, and appends deltas in order', () => {
    const cid = startNew();
    expect(port.sent[0]).toMatchObject({ type: 'send', conversation_id: null, text: 'What is the capital of France?' });
    // optimistic user message shows at once
    const t0 = store.thread('new');
    expect(t0).toHaveLength(1);
    expect(store.messages.get(t0[0])!.status).toBe('sending');

    store.handleFrame({ type: 'conversation', conversation: conv(7, 'What is the capital of France?') });
    expect(store.currentId).toBe(7);
    expect(store.conversations[0].id).toBe(7);
    store.handleFrame({
      type: 'start',
      conversation_id: 7,
      client_id: cid,
      user_message: msg({ id: 14, role: 'user', conversation_id: 7, text: 'What is the capital of France?' }),
      message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 14 }),
    });
    expect(store.thread(7)).toEqual([14, 15]);
    expect(store.pendingSends.size).toBe(0);
    store.handleFrame({ type: 'delta', message_id: 15, text: 'The capital' });
    store.handleFrame({ type: 'delta', message_id: 15, text: ' of France' });
    store.handleFrame({ type: 'delta', message_id: 15, text: ' is Paris.' });
    expect(store.messages.get(15)!.text).toBe('The capital of France is Paris.');
    expect(store.streamingIn(7)!.id).toBe(15);
    store.handleFrame({
      type: 'done', message_id: 15, status: 'complete', finish_reason: 'stop',
      stats: { ttft_ms: 84.2, output_tokens: 8, tokens_per_s: 41.7, prompt_tokens: 31, cached_tokens: 0 },
    });
    const m = store.messages.get(15)!;
    expect(m.status).toBe('complete');
    expect(m.stats!.ttft_ms).toBe(84.2);
    expect(store.isBusy(7)).toBe(false);
  });

  it('coalesces many deltas into one notification per frame', () => {
    const queued: (() => void)[] = [];
    const s = new Store(port, api, (fn) => queued.push(fn));
    let n = 0;
    s.subscribe(() => n++);
    s.applyConversation(conv(1), [msg({ id: 1, role: 'user', text: 'hi' }), msg({ id: 2, role: 'assistant', status: 'streaming', parent_id: 1 })]);
    queued.splice(0).forEach((f) => f());
    n = 0;
    for (const piece of ['a', 'b', 'c', 'd']) s.handleFrame({ type: 'delta', message_id: 2, text: piece });
    expect(queued).toHaveLength(1);
    queued.splice(0).forEach((f) => f());
    expect(n).toBe(1);
    expect(s.messages.get(2)!.text).toBe('abcd');
  });

  it('ignores deltas for unknown messages and empty deltas', () => {
    store.handleFrame({ type: 'delta', message_id: 99, text: 'x' });
    expect(store.messages.has(99)).toBe(false);
    store.applyConversation(conv(1), [msg({ id: 2, role: 'assistant', status: 'streaming', text: 'a' })]);
    const before = store.messages.get(2);
    store.handleFrame({ type: 'delta', message_id: 2, text: '' });
    expect(store.messages.get(2)).toBe(before);
  });

  it('replaces message objects instead of mutating them (so views can compare)', () => {
    store.applyConversation(conv(1), [msg({ id: 2, role: 'assistant', status: 'streaming', text: 'a' })]);
    const a = store.messages.get(2)!;
    store.handleFrame({ type: 'delta', message_id: 2, text: 'b' });
    expect(a.text).toBe('a');
    expect(store.messages.get(2)).not.toBe(a);
  });

  it('refuses to send while offline and keeps the text', () => {
    port.isOpen = false;
    store.setConn('reconnecting');
    const r = store.sendMessage('hello');
    expect(r.ok).toBe(false);
    expect(r.error).toMatch(/offline/i);
    expect(port.sent).toHaveLength(0);
    expect(store.thread('new')).toHaveLength(0);
    expect(store.noticesFor('new')[0].code).toBe('offline');
  });

  it('refuses a message over the server\'s length limit, in words, before sending it', () => {
    store.engine = { model: 't', max_model_len: 2048, speculative_modes: [], defaults: { temperature: 0.7, top_p: 0.9, max_tokens: 256 }, max_message_chars: 10 };
    const r = store.sendMessage('x'.repeat(11));
    expect(r.ok).toBe(false);
    expect(r.error).toMatch(/too long.*11 characters.*limit is 10/);
    expect(port.sent).toHaveLength(0);
    expect(store.thread('new')).toHaveLength(0);
    expect(store.noticesFor('new')[0].code).toBe('message_too_long');
    expect(store.sendMessage('x'.repeat(10)).ok).toBe(true);
  });

  it('refuses a second send while a reply is streaming', () => {
    store.applyConversation(conv(1), [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', status: 'streaming', parent_id: 1 })]);
    store.currentId = 1;
    expect(store.sendMessage('again').ok).toBe(false);
    expect(port.sent.filter((f) => f.type === 'send')).toHaveLength(0);
  });

  it('stop sends the message id; a stop before start waits for the start', () => {
    const cid = startNew('hi');
    expect(store.stop()).toBe(true);
    expect(port.sent.filter((f) => f.type === 'stop')).toHaveLength(0);
    store.handleFrame({ type: 'conversation', conversation: conv(3) });
    store.handleFrame({
      type: 'start', conversation_id: 3, client_id: cid,
      user_message: msg({ id: 10, role: 'user', conversation_id: 3 }),
      message: msg({ id: 11, role: 'assistant', conversation_id: 3, status: 'streaming', parent_id: 10 }),
    });
    expect(port.sent[port.sent.length - 1]).toEqual({ type: 'stop', message_id: 11 });
    store.handleFrame({ type: 'done', message_id: 11, status: 'stopped', finish_reason: 'abort', stats: { output_tokens: 2 } });
    expect(store.messages.get(11)!.status).toBe('stopped');
  });
});

describe('errors', () => {
  it('puts the text back and shows plain words when a send is rejected', () => {
    const cid = startNew('too much');
    store.handleFrame({ type: 'error', code: 'busy', message: 'queue full', client_id: cid });
    expect(store.thread('new')).toHaveLength(0);
    expect(store.getDraft('new')).toBe('too much');
    const n = store.noticesFor('new');
    expect(n[0].text).toMatch(/busy/i);
    expect(n[0].text).not.toContain('queue full');
  });

  it('marks a streaming message as failed when its resume is not found', () => {
    store.applyConversation(conv(1), [msg({ id: 5, role: 'assistant', status: 'streaming', text: 'part' })]);
    store.handleFrame({ type: 'error', code: 'not_found', message: 'x', message_id: 5 });
    expect(store.messages.get(5)!.status).toBe('error');
    expect(store.noticesFor(1)).toHaveLength(1);
  });

  it('shows frame errors without context as toasts', () => {
    store.handleFrame({ type: 'error', code: 'bad_frame', message: 'unknown type' });
    expect(store.toasts).toHaveLength(1);
    store.dismiss(store.toasts[0].id);
    expect(store.toasts).toHaveLength(0);
  });

  it('uses the server sentence for invalid values', () => {
    store.handleFrame({ type: 'error', code: 'invalid', message: 'temperature must be between 0 and 2', conversation_id: 4 });
    expect(store.noticesFor(4)[0].text).toBe('temperature must be between 0 and 2');
  });
});

describe('reconnect and resume', () => {
  it('resumes streaming messages from a page load once open, and on reconnect', async () => {
    port.isOpen = false;
    store.setConn('connecting');
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', status: 'streaming', text: 'Half', parent_id: 1 })] });
    await store.selectConversation(1);
    expect(port.queued.map((q) => q.frame)).toEqual([{ type: 'resume', message_id: 2 }]);
    port.isOpen = true;
    store.setConn('open');
    store.onOpen(false);
    expect(port.sent).toEqual([{ type: 'resume', message_id: 2 }]);
    store.handleFrame({ type: 'snapshot', message: msg({ id: 2, role: 'assistant', status: 'streaming', text: 'Half a rep', parent_id: 1 }) });
    store.handleFrame({ type: 'delta', message_id: 2, text: 'ly' });
    expect(store.messages.get(2)!.text).toBe('Half a reply');
    // connection drops mid-reply, comes back: resume again, snapshot replaces the text
    port.isOpen = false;
    store.setConn('reconnecting');
    expect(store.live.size).toBe(0);
    port.isOpen = true;
    port.sent = [];
    store.setConn('open');
    store.onOpen(true);
    expect(port.sent).toContainEqual({ type: 'resume', message_id: 2 });
    store.handleFrame({ type: 'snapshot', message: msg({ id: 2, role: 'assistant', status: 'complete', text: 'Half a reply, done.', parent_id: 1 }) });
    expect(store.messages.get(2)!.text).toBe('Half a reply, done.');
    expect(store.messages.get(2)!.status).toBe('complete');
    await flush();
  });

  it('does not resume a reply it is already receiving live', () => {
    const cid = startNew('x');
    store.handleFrame({ type: 'conversation', conversation: conv(2) });
    store.handleFrame({ type: 'start', conversation_id: 2, client_id: cid, user_message: msg({ id: 3, role: 'user', conversation_id: 2 }), message: msg({ id: 4, role: 'assistant', conversation_id: 2, status: 'streaming', parent_id: 3 }) });
    store.handleFrame({ type: 'delta', message_id: 4, text: 'abc' });
    store.applyConversation(conv(2), [msg({ id: 3, role: 'user', conversation_id: 2 }), msg({ id: 4, role: 'assistant', conversation_id: 2, status: 'streaming', text: 'a', parent_id: 3 })]);
    expect(port.sent.filter((f) => f.type === 'resume')).toHaveLength(0);
    expect(store.messages.get(4)!.text).toBe('abc'); // the database's shorter text does not win
  });

  it('gives a send back to the composer when the connection dropped before it was confirmed', () => {
    startNew('lost?');
    store.setConn('reconnecting');
    store.onOpen(true);
    expect(store.thread('new')).toHaveLength(0);
    expect(store.getDraft('new')).toBe('lost?');
    expect(store.noticesFor('new')[0].code).toBe('not_confirmed');
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
    store.applyConversation(conv(1), base());
    store.currentId = 1;
    expect(store.regenerate(4).ok).toBe(true);
    expect(port.sent.at(-1)).toEqual({ type: 'regenerate', message_id: 4 });
    expect(store.isBusy(1)).toBe(true);
    store.handleFrame({ type: 'start', conversation_id: 1, user_message: base()[2], message: msg({ id: 5, role: 'assistant', status: 'streaming', parent_id: 3 }) });
    expect(store.thread(1)).toEqual([1, 2, 3, 5]);
    expect(store.messages.get(5)!.alternatives).toEqual([4, 5]);
    expect(store.messages.get(5)!.alternative_index).toBe(1);
  });

  it('edit branches after the parent of the edited message', () => {
    store.applyConversation(conv(1), base());
    store.currentId = 1;
    expect(store.edit(1, 'q1 edited').ok).toBe(true);
    expect(port.sent.at(-1)).toEqual({ type: 'edit', message_id: 1, text: 'q1 edited' });
    store.handleFrame({ type: 'start', conversation_id: 1, user_message: msg({ id: 6, role: 'user', text: 'q1 edited', parent_id: null }), message: msg({ id: 7, role: 'assistant', status: 'streaming', parent_id: 6 }) });
    expect(store.thread(1)).toEqual([6, 7]);
    expect(store.messages.get(6)!.alternatives).toEqual([1, 6]);
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
    store.applyConversation(conv(1), msgs);
    expect((await store.showAlternative(4, 1)).ok).toBe(true);
    expect(api.calls).toContainEqual(['patch', 1, { active_message: 5 }]);
    expect(api.calls.at(-1)).toEqual(['get', 1]);
    expect((await store.showAlternative(4, -1)).ok).toBe(false); // already the first
  });
});

describe('conversation list', () => {
  it('keeps newest first, applies titles, renames, deletes, searches', async () => {
    api.convs.set(1, { conversation: conv(1, 'Old', '2026-11-29T00:00:00Z'), messages: [] });
    api.convs.set(2, { conversation: conv(2, 'Pasta recipe', '2026-11-30T00:00:00Z'), messages: [] });
    await store.refreshList();
    expect(store.conversations.map((c) => c.id)).toEqual([1, 2]); // server order is kept as given
    store.handleFrame({ type: 'conversation', conversation: conv(3, 'New one') });
    expect(store.conversations[0].id).toBe(3);
    store.handleFrame({ type: 'title', conversation_id: 3, title: 'Better title' });
    expect(store.conversation(3)!.title).toBe('Better title');
    await store.rename(2, 'Pasta');
    expect(store.conversation(2)!.title).toBe('Pasta');
    await store.search('Pas');
    expect(store.searchResults!.map((c) => c.id)).toEqual([2]);
    await store.search('');
    expect(store.searchResults).toBeNull();
    await store.selectConversation(1);
    await store.deleteConversation(1);
    expect(store.conversation(1)).toBeUndefined();
    expect(store.currentId).toBeNull();
  });

  it('a start in an existing conversation moves it to the top', () => {
    store.conversations = [conv(1), conv(2)];
    store.applyConversation(conv(2), [msg({ id: 1, role: 'user', conversation_id: 2 }), msg({ id: 2, role: 'assistant', conversation_id: 2, parent_id: 1 })]);
    store.currentId = 2;
    const cid = startNew('more');
    store.handleFrame({ type: 'start', conversation_id: 2, client_id: cid, user_message: msg({ id: 3, role: 'user', conversation_id: 2, parent_id: 2 }), message: msg({ id: 4, role: 'assistant', status: 'streaming', conversation_id: 2, parent_id: 3 }) });
    expect(store.conversations[0].id).toBe(2);
    expect(store.thread(2)).toEqual([1, 2, 3, 4]);
  });

  it('settings for a new chat go with the first send; for a saved one they are PATCHed', async () => {
    await store.saveSettings(null, { system_prompt: 'Be brief.', temperature: 0.2, top_p: 1, max_tokens: 64 });
    startNew('hi');
    expect(port.sent.at(-1)).toMatchObject({ settings: { system_prompt: 'Be brief.', temperature: 0.2, top_p: 1, max_tokens: 64 } });
    api.convs.set(9, { conversation: conv(9), messages: [] });
    store.conversations = [conv(9)];
    await store.saveSettings(9, { temperature: 1.1 });
    expect(api.calls.at(-1)).toEqual(['patch', 9, { settings: { temperature: 1.1 } }]);
    expect(store.conversation(9)!.settings).toEqual({ temperature: 1.1 });
  });
});

describe('server details', () => {
  it('drops a repeated delta by its sequence number after a snapshot', () => {
    store.applyConversation(conv(1), [msg({ id: 2, role: 'assistant', status: 'streaming', text: '' })]);
    store.handleFrame({ type: 'snapshot', message: { ...msg({ id: 2, role: 'assistant', status: 'streaming', text: 'abc' }), seq: 3 } });
    store.handleFrame({ type: 'delta', message_id: 2, text: 'c', seq: 3 });
    store.handleFrame({ type: 'delta', message_id: 2, text: 'de', seq: 5 });
    expect(store.messages.get(2)!.text).toBe('abcde');
  });

  it('regenerate with user_message null still replaces the reply', () => {
    store.applyConversation(conv(1), [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', parent_id: 1 })]);
    store.currentId = 1;
    store.regenerate(2);
    store.handleFrame({ type: 'start', conversation_id: 1, user_message: null, message: msg({ id: 3, role: 'assistant', status: 'streaming', parent_id: 1, alternatives: [2, 3], alternative_index: 1 }) });
    expect(store.thread(1)).toEqual([1, 3]);
    expect(store.messages.get(3)!.alternatives).toEqual([2, 3]);
  });

  it('accepts a PATCH answer that carries the branch', async () => {
    const msgs = [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', parent_id: 1, alternatives: [2, 3], alternative_index: 0 })];
    store.applyConversation(conv(1), msgs);
    (api as any).patch = async (id: number, body: any) => {
      api.calls.push(['patch', id, body]);
      return { conversation: conv(1), messages: [msgs[0], msg({ id: 3, role: 'assistant', parent_id: 1, text: 'other', alternatives: [2, 3], alternative_index: 1 })] };
    };
    expect((await store.showAlternative(2, 1)).ok).toBe(true);
    expect(store.thread(1)).toEqual([1, 3]);
    expect(api.calls.filter((c) => c[0] === 'get')).toHaveLength(0);
    await store.rename(1, 'New name');
    expect(store.conversation(1)!.title).toBe('Chat 1'); // the answer's conversation wins
    expect((store.conversation(1) as any).messages).toBeUndefined();
  });

  it('keeps unchanged message objects when a conversation is reloaded', () => {
    const msgs = [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', parent_id: 1, text: 'a' })];
    store.applyConversation(conv(1), msgs);
    const a = store.messages.get(2);
    store.applyConversation(conv(1), structuredClone(msgs));
    expect(store.messages.get(2)).toBe(a);
  });
});

describe('unconfirmed sends after a reconnect', () => {
  it('drops the local copy quietly when the server did save the message', async () => {
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', parent_id: 1, text: 'a' })] });
    await store.selectConversation(1);
    startNew('follow-up');
    // the server got it and is streaming the reply; the socket dropped before `start` arrived
    api.convs.get(1)!.messages.push(msg({ id: 3, role: 'user', text: 'follow-up', parent_id: 2 }), msg({ id: 4, role: 'assistant', status: 'streaming', text: 'Par', parent_id: 3 }));
    port.sent = [];
    store.setConn('reconnecting');
    store.setConn('open');
    store.onOpen(true);
    await flush();
    await flush();
    expect(store.thread(1)).toEqual([1, 2, 3, 4]);
    expect(store.getDraft(1)).toBe('');
    expect(store.noticesFor(1)).toHaveLength(0);
    expect(port.sent).toContainEqual({ type: 'resume', message_id: 4 });
  });

  it('gives the text back when the server did not save it', async () => {
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', parent_id: 1, text: 'a' })] });
    await store.selectConversation(1);
    startNew('lost words');
    store.setConn('reconnecting');
    store.setConn('open');
    store.onOpen(true);
    await flush();
    await flush();
    expect(store.thread(1)).toEqual([1, 2]);
    expect(store.getDraft(1)).toBe('lost words');
    expect(store.noticesFor(1)[0].code).toBe('not_confirmed');
  });
});

describe('refused actions', () => {
  it('an error for a refused regenerate clears the busy state and shows in the conversation', () => {
    store.applyConversation(conv(1), [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', parent_id: 1 })]);
    store.currentId = 1;
    store.regenerate(2);
    expect(store.isBusy(1)).toBe(true);
    store.handleFrame({ type: 'error', code: 'busy', message: 'full' });
    expect(store.isBusy(1)).toBe(false);
    expect(store.noticesFor(1)[0].code).toBe('busy');
  });

  it('records when the person pressed send on the reply (for the TTFT they see)', () => {
    const cid = startNew('hi');
    store.handleFrame({ type: 'conversation', conversation: conv(2) });
    store.handleFrame({ type: 'start', conversation_id: 2, client_id: cid, user_message: msg({ id: 3, role: 'user', conversation_id: 2 }), message: msg({ id: 4, role: 'assistant', conversation_id: 2, status: 'streaming', parent_id: 3 }) });
    expect(typeof store.messages.get(4)!.client_sent_at).toBe('number');
  });
});

describe('resume once per connection', () => {
  it('does not ask twice before the snapshot arrives', async () => {
    api.convs.set(1, { conversation: conv(1), messages: [msg({ id: 1, role: 'user' }), msg({ id: 2, role: 'assistant', status: 'streaming', parent_id: 1 })] });
    await store.selectConversation(1);
    await store.loadConversation(1, true); // e.g. the catch-up reload after a reconnect
    expect(port.sent.filter((f) => f.type === 'resume')).toHaveLength(1);
    store.setConn('reconnecting');
    store.setConn('open');
    store.onOpen(true);
    await flush();
    expect(port.sent.filter((f) => f.type === 'resume')).toHaveLength(2);
  });
});
