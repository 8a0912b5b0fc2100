// Temporary chats, feedback and saved prompts in the page's state; the palette's matching.
import { beforeEach, describe, expect, it } from 'vitest';
import { createChat } from '../src/chat';
import type { Conversations } from '../src/conversations';
import { matching, SavedPrompts, slashQuery, type PromptsPort, type SavedPrompt } from '../src/prompts';
import type { ChatProtocol } from '../src/protocol';
import type { UiState } from '../src/ui-state';
import { fits } from '../src/ui/Palette';
import { conv, FakeApi, FakePort, flush, msg } from './fakes';

class Api extends FakeApi {
  rated: [number, any][] = [];
  async feedback(id: number, body: any) {
    this.rated.push([id, body]);
    return { feedback: body.rating ? { rating: body.rating, comment: body.comment || '' } : null };
  }
}

let port: FakePort;
let api: Api;
let conversations: Conversations;
let protocol: ChatProtocol;
let ui: UiState;

beforeEach(() => {
  port = new FakePort();
  api = new Api();
  ({ conversations, protocol, ui } = createChat(port, api));
  protocol.setConn('open');
});

function startTemporary(): number {
  conversations.setTemporaryMode(true);
  expect(protocol.sendMessage('a secret').ok).toBe(true);
  const frame = port.sent[port.sent.length - 1] as any;
  expect(frame.temporary).toBe(true);
  const c = { ...conv(9, 'a secret'), temporary: true };
  protocol.handleFrame({ type: 'conversation', conversation: c });
  protocol.handleFrame({
    type: 'start',
    conversation_id: 9,
    client_id: frame.client_id,
    user_message: msg({ id: 90, conversation_id: 9, role: 'user', text: 'a secret' }),
    message: msg({ id: 91, conversation_id: 9, role: 'assistant', status: 'streaming', parent_id: 90 }),
  });
  return 9;
}

describe('temporary chats', () => {
  it('are sent as temporary, kept out of the list, and deleted when left', async () => {
    const id = startTemporary();
    expect(conversations.currentId.value).toBe(id);
    expect(conversations.isTemporary(id)).toBe(true);
    expect(conversations.list.value).toEqual([]);
    expect(conversations.conversation(id)?.title).toBe('a secret');
    conversations.newChat();
    await flush();
    expect(api.calls).toContainEqual(['remove', id]);
    expect(conversations.thread(id)).toEqual([]);
    expect(conversations.message(91)).toBeUndefined();
    // The switch stays on for the next new chat until it is turned off.
    expect(conversations.isTemporary(null)).toBe(true);
    conversations.newChat(false);
    expect(protocol.sendMessage('kept').ok).toBe(true);
    expect((port.sent[port.sent.length - 1] as any).temporary).toBeUndefined();
  });
  it('end when the socket comes back after a drop (the server deleted them with it)', () => {
    const id = startTemporary();
    protocol.onOpen(true);
    expect(conversations.currentId.value).toBeNull();
    expect(conversations.isTemporary(id)).toBe(false);
    expect(ui.toasts.value.map((t) => t.text).join(' ')).toMatch(/temporary chat ended/);
  });
  it('only a new chat carries the flag', () => {
    conversations.apply(conv(3), [msg({ id: 30, conversation_id: 3, role: 'user', text: 'q' })]);
    void conversations.select(3);
    conversations.setTemporaryMode(true);
    expect(protocol.sendMessage('more').ok).toBe(true);
    expect((port.sent[port.sent.length - 1] as any).temporary).toBeUndefined();
  });
});

describe('feedback', () => {
  it('is sent, shown on the reply, and taken back', async () => {
    conversations.apply(conv(1), [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', text: 'a', parent_id: 1 })]);
    expect((await conversations.giveFeedback(2, 'down', 'wrong')).ok).toBe(true);
    expect(api.rated).toEqual([[2, { rating: 'down', comment: 'wrong' }]]);
    expect(conversations.message(2)?.feedback).toEqual({ rating: 'down', comment: 'wrong' });
    await conversations.giveFeedback(2, null);
    expect(conversations.message(2)?.feedback).toBeNull();
  });
});

describe('saved prompts', () => {
  const all: SavedPrompt[] = [
    { id: 1, name: 'summarize', text: 'Summarize:' },
    { id: 2, name: 'eli5', text: 'Explain simply' },
    { id: 3, name: 'tldr-summary', text: 'TL;DR' },
  ];
  it('are offered for a slash at the start of the box only', () => {
    expect(slashQuery('/')).toBe('');
    expect(slashQuery('/Sum')).toBe('sum');
    expect(slashQuery('/etc/hosts')).toBeNull();
    expect(slashQuery('a /sum')).toBeNull();
    expect(slashQuery('/sum more words')).toBeNull();
    expect(matching(all, 'sum').map((p) => p.name)).toEqual(['summarize', 'tldr-summary']);
    expect(matching(all, '').length).toBe(3);
  });
  it('load once, and stay sorted as they change', async () => {
    let lists = 0;
    const port: PromptsPort = {
      list: async () => (lists++, { prompts: [all[1]] }),
      create: async (b) => ({ id: 7, ...b }),
      update: async (id, b) => ({ ...all[1], ...b, id }),
      remove: async () => undefined,
    };
    const prompts = new SavedPrompts(port);
    await Promise.all([prompts.load(), prompts.load()]);
    expect(lists).toBe(1);
    await prompts.create('abc', 'x');
    expect(prompts.list.value.map((p) => p.name)).toEqual(['abc', 'eli5']);
    await prompts.remove(7);
    expect(prompts.list.value.map((p) => p.name)).toEqual(['eli5']);
  });
});

describe('the palette', () => {
  it('matches every word in any order', () => {
    expect(fits('lisbon trip', 'Trip to Lisbon')).toBe(true);
    expect(fits('paris trip', 'Trip to Lisbon')).toBe(false);
    expect(fits('', 'anything')).toBe(true);
  });
});
