import type { ClientFrame, ServerFrame } from './types';

/** The part of the browser WebSocket we use (so tests can pass a fake). */
export interface SocketLike {
  readonly readyState: number;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: any) => any) | null;
  onclose: ((ev: any) => any) | null;
  onmessage: ((ev: any) => any) | null;
  onerror: ((ev: any) => any) | null;
}
export type SocketFactory = (url: string) => SocketLike;

export type ConnState = 'connecting' | 'open' | 'reconnecting' | 'unavailable' | 'unauthorized' | 'closed';

export interface ChatSocketOptions {
  url: string;
  factory?: SocketFactory;
  onFrame: (frame: ServerFrame) => void;
  onState?: (state: ConnState, info: { attempt: number; retryInMs?: number }) => void;
  /** Called each time the socket opens; `reconnected` is false only the first time. */
  onOpen?: (reconnected: boolean) => void;
  baseDelayMs?: number;
  maxDelayMs?: number;
  /** 0..1, +/- fraction of randomness on each delay. */
  jitter?: number;
  pingIntervalMs?: number;
  /** No frame within this long after a ping: the socket is considered dead. */
  pongTimeoutMs?: number;
  random?: () => number;
}

const OPEN = 1;

export function wsUrl(loc: { protocol: string; host: string } = location): string {
  return (loc.protocol === 'https:' ? 'wss' : 'ws') + '://' + loc.host + '/ws/chat/';
}

/** Delay before reconnect attempt number `attempt` (0-based). */
export function backoffDelay(attempt: number, base = 500, max = 10000, jitter = 0.2, random = Math.random): number {
  const raw = Math.min(max, base * Math.pow(2, attempt));
  const j = raw * jitter * (random() * 2 - 1);
  return Math.max(0, Math.round(raw + j));
}

/**
 * One WebSocket with reconnect (exponential backoff), keepalive pings, and a small queue
 * for control frames (`stop`, `resume`) that may wait for the connection. User messages
 * are never queued: `send` refuses them while disconnected so the UI can say so.
 */
export class ChatSocket {
  state: ConnState = 'closed';
  private ws: SocketLike | null = null;
  private attempt = 0;
  private opened = 0;
  private retryTimer: ReturnType<typeof setTimeout> | null = null;
  private pingTimer: ReturnType<typeof setInterval> | null = null;
  private pongTimer: ReturnType<typeof setTimeout> | null = null;
  private stopped = false;
  private queue: { key?: string; frame: ClientFrame }[] = [];
  private o: Required<Omit<ChatSocketOptions, 'onState' | 'onOpen'>> & Pick<ChatSocketOptions, 'onState' | 'onOpen'>;

  constructor(opts: ChatSocketOptions) {
    this.o = {
      factory: (url: string) => new WebSocket(url) as unknown as SocketLike,
      baseDelayMs: 500,
      maxDelayMs: 10000,
      jitter: 0.2,
      pingIntervalMs: 25000,
      pongTimeoutMs: 10000,
      random: Math.random,
      ...opts,
    } as any;
  }

  get isOpen(): boolean {
    return this.state === 'open' && !!this.ws && this.ws.readyState === OPEN;
  }

  /** Frames waiting for the connection (for tests and the UI). */
  get pending(): ClientFrame[] {
    return this.queue.map((q) => q.frame);
  }

  start(): void {
    this.stopped = false;
    if (!this.ws) this.connect();
  }

  /** Close for good (no reconnect). */
  close(): void {
    this.stopped = true;
    this.clearTimers();
    const ws = this.ws;
    this.ws = null;
    if (ws) {
      ws.onopen = ws.onclose = ws.onmessage = ws.onerror = null;
      try { ws.close(1000); } catch { /* ignore */ }
    }
    this.setState('closed');
  }

  /** Reconnect now if we are waiting to (e.g. the browser came back online). */
  reconnectNow(): void {
    if (this.stopped || this.state === 'unauthorized') return;
    if ((this.state === 'reconnecting' || this.state === 'unavailable') && this.retryTimer) {
      clearTimeout(this.retryTimer);
      this.retryTimer = null;
      this.attempt = 0;
      this.connect();
    }
  }

  /**
   * The browser says the network is gone: treat the socket as dead at once (an open
   * WebSocket may not notice for a long while), so sends are refused visibly and the
   * reconnect starts; `reconnectNow` brings it back when the browser is online again.
   */
  goneOffline(): void {
    if (this.stopped || this.state === 'unauthorized') return;
    if (this.ws) this.drop('offline');
  }

  private drop(reason: string): void {
    const ws = this.ws;
    if (!ws) return;
    this.ws = null;
    ws.onopen = ws.onclose = ws.onmessage = ws.onerror = null;
    try { ws.close(4000, reason); } catch { /* ignore */ }
    this.clearTimers();
    this.scheduleReconnect();
  }

  /** Send now. Returns false (and sends nothing) when the socket is not open. */
  send(frame: ClientFrame): boolean {
    if (!this.isOpen) return false;
    try {
      this.ws!.send(JSON.stringify(frame));
      return true;
    } catch {
      return false;
    }
  }

  /**
   * Send now if open, otherwise keep it until the socket opens. A frame with the same key
   * replaces the queued one (so two resumes of one message are sent once).
   */
  sendWhenOpen(frame: ClientFrame, key?: string): boolean {
    if (key) this.queue = this.queue.filter((q) => q.key !== key);
    if (this.send(frame)) return true;
    this.queue.push({ key, frame });
    return false;
  }

  /** Drop queued frames with this key (e.g. the stop is no longer needed). */
  unqueue(key: string): void {
    this.queue = this.queue.filter((q) => q.key !== key);
  }

  private setState(s: ConnState, info: { retryInMs?: number } = {}): void {
    this.state = s;
    this.o.onState?.(s, { attempt: this.attempt, ...info });
  }

  private connect(): void {
    this.clearTimers();
    this.setState(this.opened > 0 || this.attempt > 0 ? 'reconnecting' : 'connecting');
    let ws: SocketLike;
    try {
      ws = this.o.factory(this.o.url);
    } catch {
      this.scheduleReconnect();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      this.attempt = 0;
      const reconnected = this.opened > 0;
      this.opened++;
      this.setState('open');
      this.startPing();
      // Hooks first (they may add frames), then whatever waited for the connection.
      this.o.onOpen?.(reconnected);
      const q = this.queue;
      this.queue = [];
      for (const item of q) {
        if (!this.send(item.frame)) this.queue.push(item);
      }
    };
    ws.onmessage = (ev: { data: unknown }) => {
      if (this.ws !== ws) return;
      this.gotTraffic();
      if (typeof ev.data !== 'string') return;
      let frame: ServerFrame;
      try {
        frame = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (!frame || typeof frame !== 'object' || typeof (frame as any).type !== 'string') return;
      if (frame.type === 'pong') return;
      this.o.onFrame(frame);
    };
    ws.onerror = () => { /* onclose follows */ };
    ws.onclose = (ev: { code?: number }) => {
      if (this.ws !== ws) return;
      this.ws = null;
      this.clearTimers();
      if (this.stopped) return this.setState('closed');
      if (ev && ev.code === 4401) {
        this.stopped = true;
        return this.setState('unauthorized');
      }
      // 4503: the server is up but a service the chat needs is not; retry with backoff.
      this.scheduleReconnect(ev && ev.code === 4503 ? 'unavailable' : 'reconnecting');
    };
  }

  private scheduleReconnect(state: ConnState = 'reconnecting'): void {
    const delay = backoffDelay(this.attempt, this.o.baseDelayMs, this.o.maxDelayMs, this.o.jitter, this.o.random);
    this.attempt++;
    this.setState(state, { retryInMs: delay });
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.connect();
    }, delay);
  }

  private startPing(): void {
    if (!this.o.pingIntervalMs) return;
    this.pingTimer = setInterval(() => {
      if (!this.send({ type: 'ping' })) return;
      if (this.pongTimer) return;
      this.pongTimer = setTimeout(() => {
        // Nothing came back: the connection is dead even if the browser has not noticed.
        this.drop('ping timeout');
      }, this.o.pongTimeoutMs);
    }, this.o.pingIntervalMs);
  }

  private gotTraffic(): void {
    if (this.pongTimer) {
      clearTimeout(this.pongTimer);
      this.pongTimer = null;
    }
  }

  private clearTimers(): void {
    if (this.retryTimer) clearTimeout(this.retryTimer);
    if (this.pingTimer) clearInterval(this.pingTimer);
    if (this.pongTimer) clearTimeout(this.pongTimer);
    this.retryTimer = this.pingTimer = this.pongTimer = null;
  }
}
