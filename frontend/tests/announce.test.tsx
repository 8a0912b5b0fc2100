import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { announcementOf } from '../src/format';
import { conv, FakeApi, FakeSocket, msg } from './fakes';
import { mountApp, type Mounted } from './mount';

let m: Mounted;
const region = () => m.root.querySelector('[data-testid="reply-announcer"]') as HTMLElement;
const receive = (f: unknown) => act(() => FakeSocket.last().receive(f));

beforeEach(async () => {
  m = await mountApp(new FakeApi());
  await act(() => FakeSocket.last().open());
  await act(() => m.conversations.apply(conv(4), [msg({ id: 1, role: 'user', conversation_id: 4, text: 'q' })]));
  await act(() => m.conversations.select(4));
});
afterEach(() => m.stop());

async function reply(id: number, pieces: string[], status = 'complete') {
  await receive({ type: 'start', conversation_id: 4, user_message: null, message: msg({ id, role: 'assistant', conversation_id: 4, status: 'streaming', parent_id: 1 }) });
  const before = region().textContent;
  for (const text of pieces) {
    await receive({ type: 'delta', message_id: id, text });
    expect(region().textContent).toBe(before); // never token by token
  }
  await receive({ type: 'done', message_id: id, status, finish_reason: status === 'stopped' ? 'abort' : 'stop' });
}

describe('the live region', () => {
  it('announces a finished reply once, and the same words again for a second reply', async () => {
    expect(region().getAttribute('aria-live')).toBe('polite');
    expect(region().textContent).toBe('');
    await reply(2, ['Paris ', 'is the **capital**', ' of France.']);
    expect(region().textContent).toBe('Reply: Paris is the capital of France.');
    const first = region().textContent;
    await reply(3, ['Paris ', 'is the **capital**', ' of France.']);
    expect(region().textContent!.trim()).toBe('Reply: Paris is the capital of France.');
    expect(region().textContent).not.toBe(first); // a change a screen reader reads again
  });

  it('says a stopped reply was stopped, and says nothing for a reply loaded already finished', async () => {
    await reply(2, ['Half'], 'stopped');
    expect(region().textContent).toBe('Reply stopped: Half');
    const before = region().textContent;
    await act(() => m.conversations.apply(conv(4), [msg({ id: 1, role: 'user', conversation_id: 4, text: 'q' }), msg({ id: 9, role: 'assistant', conversation_id: 4, text: 'old', parent_id: 1 })]));
    expect(region().textContent).toBe(before);
  });

  it('keeps long replies brief and drops markdown marks', () => {
    const long = announcementOf(msg({ id: 1, role: 'assistant', text: '# Title\n\n' + 'word '.repeat(200) + '\n```py\nx = 1\n```' }));
    expect(long.length).toBeLessThan(420);
    expect(long).toMatch(/^Reply: Title word word .*…$/);
  });
});
