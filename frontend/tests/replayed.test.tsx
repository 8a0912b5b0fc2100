import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Conversations } from '../src/conversations';
import { ChatSocket } from '../src/ws';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakeSocket, msg } from './fakes';

let root: HTMLElement;
let m: Mounted;
let conversations: Conversations;
let socket: ChatSocket;

const reply = (id: number) => root.querySelector(`[data-message-id="${id}"]`) as HTMLElement;
const figures = { ttft_ms: 1.2, output_tokens: 9, tokens_per_s: 900, prompt_tokens: 20, cached_tokens: 0 };

beforeEach(async () => {
  m = await mountApp(new FakeApi());
  ({ root, socket, conversations } = m);
  await act(() => FakeSocket.last().open());
});

afterEach(() => m.stop());

describe('a reply replayed from the response cache', () => {
  it('is marked when its done frame says replayed, and a generated one is not', async () => {
    conversations.apply(conv(5), [
      msg({ id: 1, role: 'user', conversation_id: 5, text: 'q' }),
      msg({ id: 2, role: 'assistant', conversation_id: 5, status: 'streaming', parent_id: 1 }),
    ]);
    await act(() => conversations.select(5));
    expect(reply(2).querySelector('[data-testid="replayed-mark"]')).toBeNull();

    await act(() => FakeSocket.last().receive({ type: 'delta', message_id: 2, text: 'Paris.', seq: 1 }));
    await act(() =>
      FakeSocket.last().receive({ type: 'done', message_id: 2, status: 'complete', finish_reason: 'stop', figures: { ...figures, replayed: true } }),
    );
    const mark = reply(2).querySelector('[data-testid="replayed-mark"]') as HTMLElement;
    expect(mark).not.toBeNull();
    expect(mark.textContent).toContain('cached reply');
    expect(mark.title).toMatch(/response cache/);
    // The usual figures are still there beside it.
    expect(reply(2).querySelector('[data-figure="ttft"]')).not.toBeNull();
  });

  it('keeps its mark when the conversation is loaded again, and only on that reply', async () => {
    conversations.apply(conv(6), [
      msg({ id: 1, role: 'user', conversation_id: 6, text: 'q' }),
      msg({ id: 2, role: 'assistant', conversation_id: 6, text: 'generated', parent_id: 1, figures }),
      msg({ id: 3, role: 'user', conversation_id: 6, text: 'q', parent_id: 2 }),
      msg({ id: 4, role: 'assistant', conversation_id: 6, text: 'replayed', parent_id: 3, figures: { ...figures, replayed: true } }),
    ]);
    await act(() => conversations.select(6));
    expect(reply(2).querySelector('[data-testid="replayed-mark"]')).toBeNull();
    expect(reply(4).querySelector('[data-testid="replayed-mark"]')).not.toBeNull();
    expect(root.querySelectorAll('[data-testid="replayed-mark"]')).toHaveLength(1);
  });
});
