import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { formatFigures } from '../src/format';
import type { Conversations } from '../src/conversations';
import { ChatSocket } from '../src/ws';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakeSocket, msg } from './fakes';

let root: HTMLElement;
let m: Mounted;
let conversations: Conversations;
let socket: ChatSocket;

const cachedFigure = (id: number) =>
  root.querySelector(`[data-message-id="${id}"] [data-figure="cached"]`) as HTMLElement;
const base = { ttft_ms: 120, output_tokens: 9, tokens_per_s: 30, prompt_tokens: 1850 };

beforeEach(async () => {
  m = await mountApp(new FakeApi());
  ({ root, socket, conversations } = m);
  await act(() => FakeSocket.last().open());
});

afterEach(() => m.stop());

describe('the cached figure counts both KV tiers', () => {
  it('formats memory only, Redis only, and both', () => {
    const cached = (s: object) => formatFigures(s)[3];
    expect(cached({ prompt_tokens: 32, cached_tokens: 24, cached_tokens_redis: 0 }).value).toBe('24 tokens (75%)');
    expect(cached({ prompt_tokens: 1850, cached_tokens: 1760, cached_tokens_redis: 1760 }).value).toBe(
      '1,760 tokens from Redis (95%)',
    );
    const both = cached({ prompt_tokens: 1850, cached_tokens: 1760, cached_tokens_redis: 1248 });
    expect(both.value).toBe('512 + 1,248 from Redis (95%)');
    expect(both.title).toMatch(/512 in memory, 1,248 restored from the Redis tier/);
    // Figures saved before the Redis figure existed read as memory; a Redis figure above the total is clamped to it.
    expect(cached({ prompt_tokens: 10, cached_tokens: 5 }).value).toBe('5 tokens (50%)');
    expect(cached({ cached_tokens: 16, cached_tokens_redis: 99 }).value).toBe('16 tokens from Redis');
  });

  it('shows a turn restored from Redis as cached when its done frame arrives', async () => {
    conversations.apply(conv(7), [
      msg({ id: 1, role: 'user', conversation_id: 7, text: 'q' }),
      msg({ id: 2, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 1 }),
    ]);
    await act(() => conversations.select(7));
    await act(() => FakeSocket.last().receive({ type: 'delta', message_id: 2, text: 'Yes.', seq: 1 }));
    await act(() =>
      FakeSocket.last().receive({
        type: 'done',
        message_id: 2,
        status: 'complete',
        finish_reason: 'stop',
        figures: { ...base, cached_tokens: 1760, cached_tokens_redis: 1760 },
      }),
    );
    expect(cachedFigure(2).textContent).toContain('1,760 tokens from Redis (95%)');
    expect(cachedFigure(2).title).toMatch(/restored from the Redis tier/);
  });

  it('shows both tiers on a reloaded conversation', async () => {
    conversations.apply(conv(8), [
      msg({ id: 1, role: 'user', conversation_id: 8, text: 'q' }),
      msg({ id: 2, role: 'assistant', conversation_id: 8, text: 'a', parent_id: 1, figures: { ...base, cached_tokens: 1760, cached_tokens_redis: 1248 } }),
    ]);
    await act(() => conversations.select(8));
    expect(cachedFigure(2).textContent).toContain('512 + 1,248 from Redis (95%)');
  });
});
