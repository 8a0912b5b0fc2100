import type { ApiError } from './api';
import { errorWords } from './errors';
import { FALLBACK_LIMITS, withinLimits, type ChatLimits } from './limits';
import type { ConnState } from './ws';
import type { ClientFrame, Conversation, EngineInfo, Message, ServerFrame, Settings } from './types';

/** A conversation id, or 'new' for a chat that has no server conversation yet. */
export type ThreadKey = number | 'new';

export interface SocketPort {
  readonly isOpen: boolean;
  send(frame: ClientFrame): boolean;
  sendWhenOpen(frame: ClientFrame, key?: string): boolean;
  unqueue?(key: string): void;
}

export interface ApiPort {
  list(q?: string): Promise<{ conversations: Conversation[] }>;
  get(id: number): Promise<{ conversation: Conversation; messages: Message[] }>;
  patch(id: number, body: { title?: string; settings?: Settings; active_message?: number }): Promise<unknown>;
  remove(id: number): Promise<void>;
  engine(): Promise<EngineInfo>;
  /** GET /api/chat/limits/; optional so a port without it falls back to FALLBACK_LIMITS. */
  limits?(): Promise<ChatLimits>;
}

export interface Notice {
  id: number;
  text: string;
  code?: string;
}

interface PendingSend {
  thread: ThreadKey;
  localId: number;
  text: string;
  sentAt: number;
}

export interface Result {
  ok: boolean;
  error?: string;
}

const now = () => (typeof performance !== 'undefined' ? performance.now() : Date.now());

let seq = 0;
const nextId = () => ++seq;

/** Pure helper: the active branch after a `start` frame (see docs/websocket.md). */
export function threadAfterStart(
  thread: number[],
  messages: Map<number, Message>,
  user: Message | null | undefined,
  reply: Message,
): number[] {
  const out = thread.filter((id) => id > 0 || !user); // drop optimistic messages once confirmed
  if (user) {
    const at = out.indexOf(user.id);
    if (at >= 0) return [...out.slice(0, at + 1), reply.id]; // regenerate: same user message
    const parent = user.parent_id;
    if (parent != null) {
      const p = out.indexOf(parent);
      if (p >= 0) return [...out.slice(0, p + 1), user.id, reply.id]; // send / edit: branch after the parent
    }
    if (parent == null) {
      // first message of a conversation, or an edit of the first message
      const first = out.length ? messages.get(out[0]) : undefined;
      if (!first || first.role !== 'system') return [user.id, reply.id];
      return [out[0], user.id, reply.id];
    }
    return [...out, user.id, reply.id];
  }
  // No user message in the frame: the reply replaces whatever follows its parent.
  if (reply.parent_id != null) {
    const p = out.indexOf(reply.parent_id);
    if (p >= 0) return [...out.slice(0, p + 1), reply.id];
  }
  return [...out, reply.id];
}

export class Store {
  // --- state (arrays and message objects are replaced, never mutated, so views can compare) ---
  conn: ConnState = 'connecting';
  conversations: Conversation[] = [];
  listLoaded = false;
  searchQuery = '';
  searchResults: Conversation[] | null = null;
  currentId: number | null = null;
  threads = new Map<ThreadKey, number[]>();
  messages = new Map<number, Message>();
  loading = new Set<number>();
  loaded = new Set<number>();
  notices = new Map<ThreadKey, Notice[]>();
  toasts: Notice[] = [];
  engine: EngineInfo | null = null;
  /** The server's settings limits (null until loaded; FALLBACK_LIMITS meanwhile). */
  limits: ChatLimits | null = null;
  draftSettings: Settings = {};
  /** Bumped when the composer text of a thread is set from outside (restored after a failure). */
  draftVersion = 0;
  version = 0;

  // --- bookkeeping ---
  private drafts = new Map<ThreadKey, string>();
  /** Streaming messages whose frames arrive on the current socket connection. */
  live = new Set<number>();
  /** Resumes already sent on the current connection. */
  private resumed = new Set<number>();
  pendingSends = new Map<string, PendingSend>();
  private pendingStops = new Set<string>();
  private pendingActions = new Map<number, 'regenerate' | 'edit'>();
  private actionSentAt = new Map<number, number>();
  private listeners = new Set<() => void>();
  private scheduled = false;
  private localSeq = 0;

  constructor(
    public socket: SocketPort,
    public api: ApiPort,
    /** How change notifications are batched; the default coalesces to one per animation frame. */
    private schedule: (fn: () => void) => void = (fn) =>
      typeof requestAnimationFrame === 'function' ? requestAnimationFrame(() => fn()) : queueMicrotask(fn),
  ) {}

  // ------------------------------------------------------------------ subscriptions
  subscribe(fn: () => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  emit(): void {
    this.version++;
    if (this.scheduled) return;
    this.scheduled = true;
    this.schedule(() => {
      this.scheduled = false;
      for (const fn of [...this.listeners]) fn();
    });
  }

  // ------------------------------------------------------------------ selectors
  get currentKey(): ThreadKey {
    return this.currentId ?? 'new';
  }

  thread(key: ThreadKey = this.currentKey): number[] {
    return this.threads.get(key) || EMPTY;
  }

  conversation(id: number | null): Conversation | undefined {
    if (id == null) return undefined;
    return this.conversations.find((c) => c.id === id) || this.searchResults?.find((c) => c.id === id);
  }

  /** The message still being written in a thread, if any (or the pending send awaiting its reply). */
  streamingIn(key: ThreadKey = this.currentKey): Message | undefined {
    for (const id of this.thread(key)) {
      const m = this.messages.get(id);
      if (m && (m.status === 'streaming' || m.status === 'sending')) return m;
    }
    return undefined;
  }

  isBusy(key: ThreadKey = this.currentKey): boolean {
    return !!this.streamingIn(key) || (typeof key === 'number' && this.pendingActions.has(key));
  }

  getDraft(key: ThreadKey = this.currentKey): string {
    return this.drafts.get(key) || '';
  }

  setDraft(key: ThreadKey, text: string, fromOutside = false): void {
    this.drafts.set(key, text);
    if (fromOutside) {
      this.draftVersion++;
      this.emit();
    }
  }

  // ------------------------------------------------------------------ notices
  notify(key: ThreadKey | null, text: string, code?: string): void {
    const n = { id: nextId(), text, code };
    if (key == null) {
      this.toasts = [...this.toasts, n].slice(-4);
    } else {
      this.notices.set(key, [...(this.notices.get(key) || []), n].slice(-3));
    }
    this.emit();
  }

  dismiss(id: number): void {
    this.toasts = this.toasts.filter((t) => t.id !== id);
    for (const [k, list] of this.notices) {
      const next = list.filter((t) => t.id !== id);
      if (next.length !== list.length) this.notices.set(k, next);
    }
    this.emit();
  }

  /** Drop every notice with this code, in all threads. */
  clearNotices(code: string): void {
    let changed = false;
    for (const [k, list] of this.notices) {
      const next = list.filter((t) => t.code !== code);
      if (next.length !== list.length) {
        this.notices.set(k, next);
        changed = true;
      }
    }
    if (changed) this.emit();
  }

  noticesFor(key: ThreadKey = this.currentKey): Notice[] {
    return this.notices.get(key) || EMPTY_NOTICES;
  }

  // ------------------------------------------------------------------ connection
  setConn(state: ConnState): void {
    if (state !== 'open') {
      this.live.clear();
      this.resumed.clear();
    }
    if (state !== this.conn) {
      this.conn = state;
      this.emit();
    }
  }

  /** Called by the socket every time it opens. */
  onOpen(reconnected: boolean): void {
    this.live.clear();
    this.resumed.clear();
    // "You are offline" is no longer true once the socket is open again.
    this.clearNotices('offline');
    if (reconnected) {
      // Sends written before the drop that never got a `start` may or may not have arrived.
      const unconfirmed = [...this.pendingSends.entries()];
      this.pendingSends.clear();
      this.pendingActions.clear();
      // Catch up with what happened while we were away.
      this.refreshList().catch(() => undefined);
      const reload = new Set<number>();
      if (this.currentId != null && this.loaded.has(this.currentId)) reload.add(this.currentId);
      for (const [, p] of unconfirmed) if (typeof p.thread === 'number') reload.add(p.thread);
      const done = new Map<number, Promise<void>>();
      for (const id of reload) done.set(id, this.loadConversation(id, true).catch(() => undefined));
      for (const [, p] of unconfirmed) {
        const settle = () => {
          if (!this.messages.has(p.localId)) return;
          // The server saved it if the branch now ends with this text from the user.
          const saved = typeof p.thread === 'number' && this.thread(p.thread).some((id) => {
            const m = this.messages.get(id);
            return id > 0 && m?.role === 'user' && m.text === p.text && (m.parent_id ?? null) === (this.messages.get(p.localId)?.parent_id ?? null);
          });
          if (saved) {
            const t = this.threads.get(p.thread);
            if (t) this.threads.set(p.thread, t.filter((id) => id !== p.localId));
            this.messages.delete(p.localId);
            this.emit();
          } else {
            this.failSend(p, 'The connection dropped before the server confirmed this message. It is back in the box — check the conversation and send it again if needed.');
          }
        };
        const wait = typeof p.thread === 'number' ? done.get(p.thread) : undefined;
        if (wait) wait.then(settle);
        else settle();
      }
    }
    this.resumeStreaming();
  }

  /** Ask the server for every reply we believe is still being written and are not receiving. */
  resumeStreaming(): void {
    for (const m of this.messages.values()) {
      if (m.status === 'streaming' && m.id > 0 && !this.live.has(m.id) && !this.resumed.has(m.id)) {
        // Once per connection; a resume queued while offline is sent when the socket opens.
        if (this.socket.sendWhenOpen({ type: 'resume', message_id: m.id }, 'resume:' + m.id)) this.resumed.add(m.id);
      }
    }
  }

  // ------------------------------------------------------------------ frames
  handleFrame(f: ServerFrame): void {
    switch (f.type) {
      case 'conversation':
        return this.onConversation(f.conversation);
      case 'start':
        return this.onStart(f);
      case 'delta':
        return this.onDelta(f.message_id, f.text, f.seq);
      case 'snapshot':
        return this.onSnapshot(f.message);
      case 'done':
        return this.onDone(f);
      case 'title':
        return this.onTitle(f.conversation_id, f.title);
      case 'error':
        return this.onError(f);
      default:
        return;
    }
  }

  private putMessage(m: Message): void {
    this.messages.set(m.id, m);
  }

  private upsertConversation(c: Conversation, toTop = false): void {
    const i = this.conversations.findIndex((x) => x.id === c.id);
    if (i >= 0) {
      const merged = { ...this.conversations[i], ...c };
      const rest = this.conversations.filter((x) => x.id !== c.id);
      this.conversations = toTop ? [merged, ...rest] : this.conversations.map((x) => (x.id === c.id ? merged : x));
    } else {
      this.conversations = [c, ...this.conversations];
    }
    if (this.searchResults) this.searchResults = this.searchResults.map((x) => (x.id === c.id ? { ...x, ...c } : x));
  }

  private bindNewThread(convId: number): void {
    const t = this.threads.get('new');
    if (!t) return;
    this.threads.delete('new');
    this.threads.set(convId, t.map((id) => id));
    for (const id of t) {
      const m = this.messages.get(id);
      if (m) this.putMessage({ ...m, conversation_id: convId });
    }
    for (const p of this.pendingSends.values()) if (p.thread === 'new') p.thread = convId;
    const n = this.notices.get('new');
    if (n) {
      this.notices.delete('new');
      this.notices.set(convId, n);
    }
    const d = this.drafts.get('new');
    this.drafts.delete('new');
    if (d) this.drafts.set(convId, d);
    this.loaded.add(convId);
    if (this.currentId == null) {
      this.currentId = convId;
      this.onNavigate?.(convId);
    }
    this.draftSettings = {};
  }

  /** Set by the app to reflect the current conversation in the URL. */
  onNavigate?: (id: number | null) => void;

  private onConversation(c: Conversation): void {
    this.upsertConversation(c, true);
    const waiting = [...this.pendingSends.values()].some((p) => p.thread === 'new');
    if (waiting) this.bindNewThread(c.id);
    this.emit();
  }

  private onStart(f: Extract<ServerFrame, { type: 'start' }>): void {
    const convId = f.conversation_id;
    const pending = f.client_id ? this.pendingSends.get(f.client_id) : undefined;
    if (pending && pending.thread === 'new') this.bindNewThread(convId);
    if (f.client_id) this.pendingSends.delete(f.client_id);
    this.pendingActions.delete(convId);

    const thread = this.thread(convId);
    const user = f.user_message || undefined;
    const reply: Message = { ...f.message, conversation_id: convId, status: 'streaming', text: f.message.text || '' };
    const sentAt = pending?.sentAt ?? (this.actionSentAt.get(convId) || undefined);
    this.actionSentAt.delete(convId);
    if (sentAt !== undefined) reply.client_sent_at = sentAt;
    const nextThread = threadAfterStart(thread, this.messages, user, reply);

    // Keep the replaced message as a local alternative until the server's list comes in.
    const pos = nextThread.indexOf(reply.id);
    const replaced = thread[pos] !== undefined ? this.messages.get(thread[pos]) : undefined;
    if (!reply.alternatives?.length && replaced && replaced.role === 'assistant' && replaced.id !== reply.id && replaced.id > 0 && thread[pos - 1] === nextThread[pos - 1]) {
      const alts = [...(replaced.alternatives?.length ? replaced.alternatives : [replaced.id]), reply.id];
      reply.alternatives = alts;
      reply.alternative_index = alts.length - 1;
    }
    if (user) {
      const upos = nextThread.indexOf(user.id);
      const oldUser = thread[upos] !== undefined ? this.messages.get(thread[upos]) : undefined;
      const u: Message = { ...user, conversation_id: convId };
      if (!u.alternatives?.length && oldUser && oldUser.role === 'user' && oldUser.id !== user.id && oldUser.id > 0) {
        const alts = [...(oldUser.alternatives?.length ? oldUser.alternatives : [oldUser.id]), user.id];
        u.alternatives = alts;
        u.alternative_index = alts.length - 1;
      }
      this.putMessage(u);
    }
    if (pending) this.messages.delete(pending.localId);
    this.putMessage(reply);
    this.threads.set(convId, nextThread);
    this.live.add(reply.id);

    const conv = this.conversation(convId);
    if (conv) this.upsertConversation({ ...conv, updated_at: reply.created_at || new Date().toISOString() }, true);

    if (f.client_id && this.pendingStops.delete(f.client_id)) {
      this.socket.sendWhenOpen({ type: 'stop', message_id: reply.id }, 'stop:' + reply.id);
    }
    this.emit();
  }

  private onDelta(id: number, text: string, seq?: number): void {
    const m = this.messages.get(id);
    if (!m || typeof text !== 'string' || !text) return;
    // Deltas carry the sequence number of their last token: one we already have is a repeat.
    if (typeof seq === 'number' && typeof m.seq === 'number' && seq <= m.seq) return;
    this.putMessage({
      ...m,
      text: m.text + text,
      status: m.status === 'sending' ? 'streaming' : m.status,
      seq: typeof seq === 'number' ? seq : m.seq,
    });
    this.live.add(id);
    this.emit();
  }

  private onSnapshot(msg: Message): void {
    const old = this.messages.get(msg.id);
    this.putMessage({ ...(old || {}), ...msg, alternatives: msg.alternatives ?? old?.alternatives, alternative_index: msg.alternative_index ?? old?.alternative_index });
    if (msg.status === 'streaming') this.live.add(msg.id);
    else this.live.delete(msg.id);
    const key = msg.conversation_id;
    if (key != null && this.threads.has(key) && !this.thread(key).includes(msg.id)) {
      this.threads.set(key, [...this.thread(key), msg.id]);
    }
    this.emit();
  }

  private onDone(f: Extract<ServerFrame, { type: 'done' }>): void {
    const old = this.messages.get(f.message_id);
    this.live.delete(f.message_id);
    if (this.socket.unqueue) this.socket.unqueue('stop:' + f.message_id);
    if (!old && !f.message) return;
    const base: Message = { ...(old as Message), ...(f.message || {}) };
    const m: Message = {
      ...base,
      alternatives: f.message?.alternatives ?? old?.alternatives,
      alternative_index: f.message?.alternative_index ?? old?.alternative_index,
      status: f.status || base.status,
      finish_reason: f.finish_reason ?? base.finish_reason,
      stats: f.stats ?? base.stats,
    };
    this.putMessage(m);
    if (f.status === 'error' && !(this.notices.get(m.conversation_id ?? 'new') || []).length) {
      m.error = errorWords('engine_error');
    }
    this.emit();
    // Pull the server's view of the branch (ids of alternatives) when something branched.
    const convId = m.conversation_id;
    if (convId != null && (m.alternatives?.length ?? 0) > 1) {
      this.loadConversation(convId, true).catch(() => undefined);
    }
  }

  private onTitle(id: number, title: string): void {
    const c = this.conversation(id);
    if (c) this.upsertConversation({ ...c, title });
    else this.upsertConversation({ id, title, created_at: new Date().toISOString(), updated_at: new Date().toISOString() });
    this.emit();
  }

  private onError(f: Extract<ServerFrame, { type: 'error' }>): void {
    const words = errorWords(f.code, f.message);
    let key: ThreadKey | null = null;
    if (f.client_id && this.pendingSends.has(f.client_id)) {
      const p = this.pendingSends.get(f.client_id)!;
      this.pendingSends.delete(f.client_id);
      this.pendingStops.delete(f.client_id);
      this.failSend(p, null);
      key = p.thread;
    }
    if (f.message_id != null) {
      const m = this.messages.get(f.message_id);
      if (m) {
        key = key ?? m.conversation_id ?? null;
        if (m.status === 'streaming' && f.code !== 'already_streaming' && f.code !== 'engine_error') {
          this.putMessage({ ...m, status: 'error', error: words });
          this.live.delete(m.id);
        }
      }
    }
    if (key == null && f.conversation_id != null) key = f.conversation_id;
    if (key == null && f.client_id) key = this.currentKey;
    if (key == null && this.pendingActions.size) {
      // A regenerate/edit was refused (errors for those frames name no conversation).
      key = this.pendingActions.keys().next().value as number;
      this.pendingActions.clear();
    }
    if (typeof key === 'number') this.pendingActions.delete(key);
    this.notify(key, words, f.code);
  }

  /** A send that did not go through: drop the optimistic message and put the text back. */
  private failSend(p: PendingSend, note: string | null): void {
    const t = this.threads.get(p.thread);
    if (t) this.threads.set(p.thread, t.filter((id) => id !== p.localId));
    this.messages.delete(p.localId);
    const draft = this.getDraft(p.thread);
    this.setDraft(p.thread, draft ? (draft.includes(p.text) ? draft : p.text + '\n\n' + draft) : p.text, true);
    if (note) this.notify(p.thread, note, 'not_confirmed');
    this.emit();
  }

  // ------------------------------------------------------------------ actions
  sendMessage(text: string): Result {
    const body = text.trim();
    const key = this.currentKey;
    if (!body) return { ok: false };
    if (!this.socket.isOpen) {
      const error = errorWords(this.conn === 'unauthorized' ? 'unauthorized' : 'offline');
      this.notify(key, error, 'offline');
      return { ok: false, error };
    }
    const limit = this.limits?.message.max_chars ?? this.engine?.max_message_chars;
    if (limit && body.length > limit) {
      const n = (x: number) => x.toLocaleString('en-US');
      const error = `This message is too long to send: ${n(body.length)} characters, and the limit is ${n(limit)}. Please shorten it or send it in parts.`;
      this.notify(key, error, 'message_too_long');
      return { ok: false, error };
    }
    if (this.isBusy(key)) {
      const error = errorWords('already_streaming');
      this.notify(key, error, 'already_streaming');
      return { ok: false, error };
    }
    const clientId = 'c' + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
    const frame: ClientFrame = { type: 'send', conversation_id: this.currentId, text: body, client_id: clientId };
    if (this.currentId == null) {
      // Never send a value the server would refuse (it then uses its default for it).
      const s = withinLimits(cleanSettings(this.draftSettings), this.limits ?? FALLBACK_LIMITS);
      if (s) frame.settings = s;
    }
    if (!this.socket.send(frame)) {
      const error = errorWords('offline');
      this.notify(key, error, 'offline');
      return { ok: false, error };
    }
    const localId = -++this.localSeq;
    const thread = this.thread(key);
    const last = thread.length ? thread[thread.length - 1] : null;
    this.putMessage({
      id: localId,
      conversation_id: this.currentId,
      role: 'user',
      text: body,
      status: 'sending',
      parent_id: last,
      client_id: clientId,
    });
    this.threads.set(key, [...thread, localId]);
    this.pendingSends.set(clientId, { thread: key, localId, text: body, sentAt: now() });
    this.drafts.set(key, '');
    this.notices.delete(key);
    this.emit();
    return { ok: true };
  }

  /** Stop the reply being written in the current conversation. */
  stop(key: ThreadKey = this.currentKey): boolean {
    const m = this.streamingIn(key);
    if (!m) return false;
    if (m.status === 'streaming' && m.id > 0) {
      this.socket.sendWhenOpen({ type: 'stop', message_id: m.id }, 'stop:' + m.id);
      return true;
    }
    if (m.status === 'sending' && m.client_id) {
      this.pendingStops.add(m.client_id);
      return true;
    }
    return false;
  }

  regenerate(messageId: number): Result {
    return this.action({ type: 'regenerate', message_id: messageId }, messageId, 'regenerate');
  }

  edit(messageId: number, text: string): Result {
    const body = text.trim();
    if (!body) return { ok: false };
    return this.action({ type: 'edit', message_id: messageId, text: body }, messageId, 'edit');
  }

  private action(frame: ClientFrame, messageId: number, kind: 'regenerate' | 'edit'): Result {
    const m = this.messages.get(messageId);
    const convId = m?.conversation_id ?? this.currentId;
    const key: ThreadKey = convId ?? 'new';
    if (!this.socket.isOpen) {
      const error = errorWords('offline').replace(', so the message was not sent. It is still in the box — send it again', '. Try again');
      this.notify(key, error, 'offline');
      return { ok: false, error };
    }
    if (this.isBusy(key)) {
      const error = errorWords('already_streaming');
      this.notify(key, error, 'already_streaming');
      return { ok: false, error };
    }
    if (!this.socket.send(frame)) return { ok: false, error: errorWords('offline') };
    if (convId != null) {
      this.pendingActions.set(convId, kind);
      this.actionSentAt.set(convId, now());
    }
    this.notices.delete(key);
    this.emit();
    return { ok: true };
  }

  newChat(): void {
    this.currentId = null;
    this.onNavigate?.(null);
    this.emit();
  }

  async selectConversation(id: number): Promise<void> {
    this.currentId = id;
    this.onNavigate?.(id);
    this.emit();
    if (!this.loaded.has(id)) await this.loadConversation(id);
  }

  async loadConversation(id: number, quiet = false): Promise<void> {
    if (this.loading.has(id)) return;
    this.loading.add(id);
    if (!quiet) this.emit();
    try {
      const data = await this.api.get(id);
      this.applyConversation(data.conversation, data.messages);
    } catch (e) {
      const err = e as ApiError;
      if (!quiet) this.notify(id, err.status === 404 ? errorWords('not_found') : err.message || 'Could not load the conversation.');
    } finally {
      this.loading.delete(id);
      this.emit();
    }
  }

  applyConversation(c: Conversation, messages: Message[]): void {
    this.upsertConversation(c);
    const ids: number[] = [];
    for (const m of messages) {
      const old = this.messages.get(m.id);
      if (old && this.live.has(m.id) && old.status === 'streaming') {
        // We are receiving this reply live: our text is newer than the database's.
        this.putMessage({ ...m, text: old.text.length >= m.text.length ? old.text : m.text, status: 'streaming' });
      } else if (old && old.status === 'streaming' && m.status === 'streaming' && old.text.length > m.text.length) {
        this.putMessage({ ...m, text: old.text });
      } else if (!old || !sameMessage(old, m)) {
        this.putMessage(m);
      }
      ids.push(m.id);
    }
    // keep optimistic messages not yet confirmed
    for (const id of this.thread(c.id)) if (id < 0 && this.messages.has(id)) ids.push(id);
    this.threads.set(c.id, ids);
    this.loaded.add(c.id);
    this.emit();
    this.resumeStreaming();
  }

  async refreshList(): Promise<void> {
    const { conversations } = await this.api.list();
    this.conversations = conversations;
    this.listLoaded = true;
    this.emit();
  }

  async search(q: string): Promise<void> {
    this.searchQuery = q;
    if (!q.trim()) {
      this.searchResults = null;
      this.emit();
      return;
    }
    this.emit();
    try {
      const { conversations } = await this.api.list(q.trim());
      if (this.searchQuery === q) {
        this.searchResults = conversations;
        this.emit();
      }
    } catch (e) {
      this.notify(null, (e as Error).message);
    }
  }

  async rename(id: number, title: string): Promise<Result> {
    const t = title.trim();
    if (!t) return { ok: false };
    try {
      const c = unwrapConversation(await this.api.patch(id, { title: t })).conversation;
      this.upsertConversation({ ...(this.conversation(id) || {}), ...(c || {}), id, title: c?.title ?? t } as Conversation);
      this.emit();
      return { ok: true };
    } catch (e) {
      this.notify(null, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  async deleteConversation(id: number): Promise<Result> {
    try {
      await this.api.remove(id);
    } catch (e) {
      const err = e as ApiError;
      if (err.status !== 404) {
        this.notify(null, err.message);
        return { ok: false, error: err.message };
      }
    }
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.searchResults) this.searchResults = this.searchResults.filter((c) => c.id !== id);
    for (const mid of this.thread(id)) this.messages.delete(mid);
    this.threads.delete(id);
    this.loaded.delete(id);
    if (this.currentId === id) this.newChat();
    this.emit();
    return { ok: true };
  }

  async saveSettings(id: number | null, settings: Settings): Promise<Result> {
    if (id == null) {
      this.draftSettings = { ...settings };
      this.emit();
      return { ok: true };
    }
    try {
      const c = unwrapConversation(await this.api.patch(id, { settings })).conversation;
      this.upsertConversation({ ...(this.conversation(id) as Conversation), ...(c || {}), id, settings: c?.settings ?? settings });
      this.emit();
      return { ok: true };
    } catch (e) {
      return { ok: false, error: (e as Error).message };
    }
  }

  /** Show another alternative of a message (‹ 1/2 ›). */
  async showAlternative(messageId: number, delta: -1 | 1): Promise<Result> {
    const m = this.messages.get(messageId);
    if (!m || !m.alternatives || m.conversation_id == null) return { ok: false };
    const idx = m.alternative_index ?? m.alternatives.indexOf(m.id);
    const target = m.alternatives[idx + delta];
    if (target == null) return { ok: false };
    if (this.isBusy(m.conversation_id)) {
      this.notify(m.conversation_id, errorWords('already_streaming'), 'already_streaming');
      return { ok: false };
    }
    try {
      const r = unwrapConversation(await this.api.patch(m.conversation_id, { active_message: target }));
      if (r.conversation && Array.isArray(r.messages)) this.applyConversation(r.conversation, r.messages);
      else await this.loadConversation(m.conversation_id, true);
      return { ok: true };
    } catch (e) {
      this.notify(m.conversation_id, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  async loadEngine(): Promise<void> {
    try {
      this.engine = await this.api.engine();
      this.emit();
    } catch {
      /* the settings dialog falls back to built-in defaults */
    }
  }

  async loadLimits(): Promise<void> {
    if (!this.api.limits) return;
    try {
      this.limits = await this.api.limits();
      this.emit();
    } catch {
      /* FALLBACK_LIMITS stay in use; the server still checks every value */
    }
  }
}

const EMPTY: number[] = [];

function sameMessage(a: Message, b: Message): boolean {
  return (
    a.text === b.text &&
    a.status === b.status &&
    a.finish_reason === b.finish_reason &&
    a.parent_id === b.parent_id &&
    a.alternative_index === b.alternative_index &&
    (a.error || '') === (b.error || '') &&
    JSON.stringify(a.alternatives || []) === JSON.stringify(b.alternatives || []) &&
    JSON.stringify(a.stats || {}) === JSON.stringify(b.stats || {})
  );
}

/** PATCH answers the conversation (docs/http.md) or {conversation, messages}; accept both. */
function unwrapConversation(r: unknown): { conversation?: Conversation; messages?: Message[] } {
  if (r && typeof r === 'object' && 'conversation' in (r as any)) return r as any;
  return { conversation: r as Conversation };
}
const EMPTY_NOTICES: Notice[] = [];

export function cleanSettings(s: Settings): Settings | undefined {
  const out: Settings = {};
  if (s.system_prompt && s.system_prompt.trim()) out.system_prompt = s.system_prompt;
  if (typeof s.temperature === 'number' && Number.isFinite(s.temperature)) out.temperature = s.temperature;
  if (typeof s.top_p === 'number' && Number.isFinite(s.top_p)) out.top_p = s.top_p;
  if (typeof s.max_tokens === 'number' && Number.isFinite(s.max_tokens)) out.max_tokens = Math.round(s.max_tokens);
  return Object.keys(out).length ? out : undefined;
}
