// A long conversation arrives a page at a time (GET /api/conversations/<id>/ answers its
// newest messages and `older`); older pages go before what is shown, and a reload keeps them.
import { expect, it } from 'vitest';
import { createChat } from '../src/chat';
import type { Message } from '../src/types';
import { conv, FakeApi, FakePort, msg } from './fakes';

/** The server's paging over one 10-message branch, 4 messages a page. */
class PagingApi extends FakeApi {
  branch: Message[] = Array.from({ length: 10 }, (_, i) =>
    msg({ id: i + 1, role: i % 2 ? 'assistant' : 'user', parent_id: i || null, text: `m${i + 1}` }),
  );
  async get(id: number, before?: number) {
    const end = before == null ? this.branch.length : this.branch.findIndex((m) => m.id === before);
    const messages = this.branch.slice(Math.max(0, end - 4), end);
    return { conversation: conv(id), messages, older: end > 4 };
  }
}

it('loads older messages before the ones shown, until none remain, and keeps them on reload', async () => {
  const { conversations } = createChat(new FakePort(), new PagingApi());
  await conversations.select(1);
  expect(conversations.thread(1)).toEqual([7, 8, 9, 10]);
  expect(conversations.hasOlder(1)).toBe(true);
  await conversations.loadOlder(1);
  expect(conversations.thread(1)).toEqual([3, 4, 5, 6, 7, 8, 9, 10]);
  await conversations.loadOlder(1);
  expect(conversations.thread(1)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  expect(conversations.hasOlder(1)).toBe(false);
  await conversations.load(1);
  expect(conversations.thread(1)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  expect(conversations.hasOlder(1)).toBe(false);
});
