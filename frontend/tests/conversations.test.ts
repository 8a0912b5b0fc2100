// Conversation state: the list, search, renames, deletes, settings, and reloads from the server.
import { beforeEach, describe, expect, it } from 'vitest';
import { createChat } from '../src/chat';
import type { Conversations } from '../src/conversations';
import type { ChatProtocol } from '../src/protocol';
import { conv, FakeApi, FakePort, msg } from './fakes';

let port: FakePort;
let api: FakeApi;
let conversations: Conversations;
let protocol: ChatProtocol;

function setUp(withApi: FakeApi = new FakeApi()) {
  port = new FakePort();
  api = withApi;
  ({ conversations, protocol } = createChat(port, api));
  protocol.setConn('open');
}

beforeEach(() => setUp());

function startNew(text = 'What is the capital of France?') {
  expect(protocol.sendMessage(text).ok).toBe(true);
  const f = port.sent[port.sent.length - 1] as any;
  return f.client_id as string;
}

describe('conversation list', () => {
  it('keeps unchanged message objects when a conversation is reloaded', () => {
    const msgs = [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', parent_id: 1, text: 'a' })];
    conversations.apply(conv(1), msgs);
    const a = conversations.message(2);
    conversations.apply(conv(1), structuredClone(msgs));
    expect(conversations.message(2)).toBe(a);
  });
  it('keeps newest first, applies titles, renames, deletes, searches', async () => {
    api.convs.set(1, { conversation: conv(1, 'Old', '2026-11-29T00:00:00Z'), messages: [] });
    api.convs.set(2, { conversation: conv(2, 'Pasta recipe', '2026-11-30T00:00:00Z'), messages: [] });
    await conversations.refreshList();
    expect(conversations.list.value.map((c) => c.id)).toEqual([1, 2]); // server order is kept as given
    protocol.handleFrame({ type: 'conversation', conversation: conv(3, 'New one') });
    expect(conversations.list.value[0].id).toBe(3);
    protocol.handleFrame({ type: 'title', conversation_id: 3, title: 'Better title' });
    expect(conversations.conversation(3)!.title).toBe('Better title');
    await conversations.rename(2, 'Pasta');
    expect(conversations.conversation(2)!.title).toBe('Pasta');
    await conversations.search('Pas');
    expect(conversations.searchResults.value!.map((c) => c.id)).toEqual([2]);
    await conversations.search('');
    expect(conversations.searchResults.value).toBeNull();
    await conversations.select(1);
    await conversations.remove(1);
    expect(conversations.conversation(1)).toBeUndefined();
    expect(conversations.currentId.value).toBeNull();
  });

  it('a start in an existing conversation moves it to the top', () => {
    conversations.apply(conv(2), [msg({ id: 1, role: 'user', conversation_id: 2 }), msg({ id: 2, role: 'assistant', conversation_id: 2, parent_id: 1 })]);
    void conversations.select(2);
    const cid = startNew('more');
    protocol.handleFrame({ type: 'start', conversation_id: 2, client_id: cid, user_message: msg({ id: 3, role: 'user', conversation_id: 2, parent_id: 2 }), message: msg({ id: 4, role: 'assistant', status: 'streaming', conversation_id: 2, parent_id: 3 }) });
    expect(conversations.list.value[0].id).toBe(2);
    expect(conversations.thread(2)).toEqual([1, 2, 3, 4]);
  });

  it('settings for a new chat go with the first send; for a saved one they are PATCHed', async () => {
    await conversations.saveSettings(null, { system_prompt: 'Be brief.', temperature: 0.2, top_p: 1, max_tokens: 64 });
    startNew('hi');
    expect(port.sent.at(-1)).toMatchObject({ settings: { system_prompt: 'Be brief.', temperature: 0.2, top_p: 1, max_tokens: 64 } });
    api.convs.set(9, { conversation: conv(9), messages: [] });
    await conversations.saveSettings(9, { temperature: 1.1 });
    expect(api.calls.at(-1)).toEqual(['patch', 9, { settings: { temperature: 1.1 } }]);
    expect(conversations.conversation(9)!.settings).toEqual({ temperature: 1.1 });
  });
});

