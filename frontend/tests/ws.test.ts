import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { backoffDelay, ChatSocket, wsUrl, type ConnState } from '../src/ws';
import { FakeSocket } from './fakes';

function make(extra: Partial<ConstructorParameters<typeof ChatSocket>[0]> = {}) {
  const frames: any[] = [];
  const states: ConnState[] = [];
  const opens: boolean[] = [];
  const s = new ChatSocket({
    url: 'ws://x/ws/chat/',
    factory: (u) => new FakeSocket(u),
    onFrame: (f) => frames.push(f),
    onState: (st) => states.push(st),
    onOpen: (r) => opens.push(r),
    random: () => 0.5, // no jitter
    pingIntervalMs: 0,
    ...extra,
  });
  return { s, frames, states, opens };
}

describe('ChatSocket', () => {
  beforeEach(() => {
    FakeSocket.all = [];
    vi.useFakeTimers();
  });
  afterEach(() => vi.useRealTimers());

  it('builds the URL from the page location', () => {
    expect(wsUrl({ protocol: 'https:', host: 'chat.example:8443' })).toBe('wss://chat.example:8443/ws/chat/');
    expect(wsUrl({ protocol: 'http:', host: 'localhost:8000' })).toBe('ws://localhost:8000/ws/chat/');
  });

  it('grows the backoff exponentially up to the cap', () => {
    const d = [0, 1, 2, 3, 4, 5, 6].map((a) => backoffDelay(a, 500, 10000, 0));
    expect(d).toEqual([500, 1000, 2000, 4000, 8000, 10000, 10000]);
    const j = backoffDelay(2, 500, 10000, 0.2, () => 1);
    expect(j).toBe(2400);
  });

  it('connects, parses frames, ignores pong and garbage', () => {
    const { s, frames, states } = make();
    s.start();
    expect(states).toEqual(['connecting']);
    const ws = FakeSocket.last();
    ws.open();
    expect(s.isOpen).toBe(true);
    ws.receive({ type: 'delta', message_id: 1, text: 'hi' });
    ws.receive({ type: 'pong' });
    ws.receive('not json');
    ws.receive('[1,2]');
    expect(frames).toEqual([{ type: 'delta', message_id: 1, text: 'hi' }]);
  });

  it('refuses sends while disconnected instead of dropping them silently', () => {
    const { s } = make();
    s.start();
    expect(s.send({ type: 'send', conversation_id: null, text: 'hello' })).toBe(false);
    FakeSocket.last().open();
    expect(s.send({ type: 'send', conversation_id: null, text: 'hello' })).toBe(true);
    expect(FakeSocket.last().sent).toEqual([{ type: 'send', conversation_id: null, text: 'hello' }]);
  });

  it('reconnects with backoff after a drop and reports the reconnect', () => {
    const { s, states, opens } = make();
    s.start();
    FakeSocket.last().open();
    expect(opens).toEqual([false]);
    FakeSocket.last().drop();
    expect(s.state).toBe('reconnecting');
    expect(FakeSocket.all.length).toBe(1);
    vi.advanceTimersByTime(499);
    expect(FakeSocket.all.length).toBe(1);
    vi.advanceTimersByTime(1);
    expect(FakeSocket.all.length).toBe(2);
    // second attempt fails too: the delay doubles
    FakeSocket.last().drop();
    vi.advanceTimersByTime(999);
    expect(FakeSocket.all.length).toBe(2);
    vi.advanceTimersByTime(1);
    expect(FakeSocket.all.length).toBe(3);
    FakeSocket.last().open();
    expect(opens).toEqual([false, true]);
    expect(states[states.length - 1]).toBe('open');
    // after a successful open the backoff starts again from the base
    FakeSocket.last().drop();
    vi.advanceTimersByTime(500);
    expect(FakeSocket.all.length).toBe(4);
  });

  it('queues control frames until the socket opens, deduplicated by key', () => {
    const { s } = make();
    s.start();
    FakeSocket.last().open();
    FakeSocket.last().drop();
    expect(s.sendWhenOpen({ type: 'resume', message_id: 5 }, 'resume:5')).toBe(false);
    expect(s.sendWhenOpen({ type: 'resume', message_id: 5 }, 'resume:5')).toBe(false);
    expect(s.sendWhenOpen({ type: 'stop', message_id: 5 }, 'stop:5')).toBe(false);
    expect(s.pending).toHaveLength(2);
    vi.advanceTimersByTime(500);
    FakeSocket.last().open();
    expect(FakeSocket.last().sent).toEqual([
      { type: 'resume', message_id: 5 },
      { type: 'stop', message_id: 5 },
    ]);
    expect(s.pending).toHaveLength(0);
  });

  it('sends resume frames from onOpen before queued frames, and only once', () => {
    let sock!: ChatSocket;
    const { s } = make({ onOpen: () => sock.sendWhenOpen({ type: 'resume', message_id: 9 }, 'resume:9') });
    sock = s;
    s.sendWhenOpen({ type: 'resume', message_id: 9 }, 'resume:9');
    s.start();
    FakeSocket.last().open();
    expect(FakeSocket.last().sent).toEqual([{ type: 'resume', message_id: 9 }]);
  });

  it('unqueue drops a waiting frame', () => {
    const { s } = make();
    s.sendWhenOpen({ type: 'stop', message_id: 3 }, 'stop:3');
    s.unqueue('stop:3');
    s.start();
    FakeSocket.last().open();
    expect(FakeSocket.last().sent).toEqual([]);
  });

  it('stops reconnecting when the server says the user is signed out (4401)', () => {
    const { s } = make();
    s.start();
    FakeSocket.last().drop(4401);
    expect(s.state).toBe('unauthorized');
    vi.advanceTimersByTime(60000);
    expect(FakeSocket.all.length).toBe(1);
  });

  it('says the server is unavailable on 4503 and keeps reconnecting until it is back', () => {
    const { s } = make();
    s.start();
    FakeSocket.last().drop(4503);
    expect(s.state).toBe('unavailable');
    vi.advanceTimersByTime(60000);
    expect(FakeSocket.all.length).toBe(2);
    FakeSocket.last().open();
    expect(s.state).toBe('open');
  });

  it('treats a missing pong as a dead connection and reconnects', () => {
    const { s } = make({ pingIntervalMs: 1000, pongTimeoutMs: 500 });
    s.start();
    const ws = FakeSocket.last();
    ws.open();
    vi.advanceTimersByTime(1000);
    expect(ws.sent).toEqual([{ type: 'ping' }]);
    ws.receive({ type: 'pong' }); // answered: stays
    vi.advanceTimersByTime(1000);
    vi.advanceTimersByTime(500); // not answered this time
    expect(ws.closedWith).toBe(4000);
    expect(s.state).toBe('reconnecting');
    vi.advanceTimersByTime(500);
    expect(FakeSocket.all.length).toBe(2);
  });

  it('goneOffline drops an open socket at once, refuses sends, and reconnects when online', () => {
    const { s, states } = make();
    s.start();
    FakeSocket.last().open();
    expect(s.isOpen).toBe(true);
    s.goneOffline();
    expect(FakeSocket.all[0].closedWith).toBe(4000);
    expect(s.state).toBe('reconnecting');
    expect(states[states.length - 1]).toBe('reconnecting');
    expect(s.send({ type: 'ping' })).toBe(false);
    s.reconnectNow();
    expect(FakeSocket.all.length).toBe(2);
    FakeSocket.last().open();
    expect(s.isOpen).toBe(true);
  });

  it('reconnectNow skips the wait; close() ends for good', () => {
    const { s } = make();
    s.start();
    FakeSocket.last().drop();
    s.reconnectNow();
    expect(FakeSocket.all.length).toBe(2);
    s.close();
    expect(s.state).toBe('closed');
    vi.advanceTimersByTime(60000);
    expect(FakeSocket.all.length).toBe(2);
  });
});
