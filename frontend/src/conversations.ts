import { batch, computed, signal, type ReadonlySignal } from '@preact/signals';
import type { ApiError } from './api';
import { errorWords } from './errors';
import type { Conversation, Feedback, Message, Organising, Rating, Settings } from './types';
import type { ThreadKey, UiState } from './ui-state';

export interface ConversationsPort {
  list(q?: string): Promise<{ conversations: Conversation[] }>;
  /** The newest page of the active branch, or the one before message `before`; `older`: more remain. */
  get(id: number, before?: number): Promise<{ conversation: Conversation; messages: Message[]; older?: boolean }>;
  patch(id: number, body: { title?: string; settings?: Settings; active_message?: number; model?: string } & Organising): Promise<unknown>;
  remove(id: number): Promise<void>;
  /** The archived conversations (out of `list`). */
  listArchived?(): Promise<{ conversations: Conversation[] }>;
  /** The owner's thumbs up or down on a reply; a null rating takes it back. */
  feedback?(messageId: number, body: { rating: Rating | null; comment?: string }): Promise<{ feedback: Feedback | null }>;
}

export interface Result {
  ok: boolean;
  error?: string;
}

const NO_IDS: readonly number[] = [];

/**
 * The conversations and their messages as this page knows them, kept up to date over HTTP
 * (docs/http.md) and by the socket protocol (protocol.ts), which writes through the
 * methods below. Arrays, maps and message objects are replaced, never changed in place,
 * so a view can tell what changed by comparing.
 */
export class Conversations {
  private readonly _list = signal<readonly Conversation[]>([]);
  private readonly _archived = signal<readonly Conversation[] | null>(null);
  private readonly _listLoaded = signal(false);
  private readonly _searchQuery = signal('');
  private readonly _searchResults = signal<readonly Conversation[] | null>(null);
  private readonly _currentId = signal<number | null>(null);
  private readonly _threads = signal<ReadonlyMap<ThreadKey, readonly number[]>>(new Map());
  private readonly _messages = signal<ReadonlyMap<number, Message>>(new Map());
  private readonly _loading = signal<ReadonlySet<number>>(new Set());
  private readonly _loaded = signal<ReadonlySet<number>>(new Set());
  /** Conversations whose branch starts before the messages loaded (GET pages it). */
  private readonly _older = signal<ReadonlySet<number>>(new Set());
  private readonly _awaiting = signal<ReadonlySet<number>>(new Set());
  private readonly _draftSettings = signal<Settings>({});
  private readonly _draftModel = signal<string | null>(null);
  /** The new chat is a temporary one (the header's switch). */
  private readonly _temporaryMode = signal(false);
  /** Temporary chats started on this page: never in the list, gone when the page goes. */
  private readonly _temps = signal<ReadonlyMap<number, Conversation>>(new Map());
  /** Replies whose frames arrive on the current connection: a reload does not overwrite their newer text. */
  private readonly receiving = new Set<number>();

  readonly list: ReadonlySignal<readonly Conversation[]> = this._list;
  /** The archived conversations, once asked for (loadArchived). */
  readonly archived: ReadonlySignal<readonly Conversation[] | null> = this._archived;
  readonly listLoaded: ReadonlySignal<boolean> = this._listLoaded;
  readonly searchResults: ReadonlySignal<readonly Conversation[] | null> = this._searchResults;
  readonly currentId: ReadonlySignal<number | null> = this._currentId;
  readonly currentKey: ReadonlySignal<ThreadKey> = computed(() => this._currentId.value ?? 'new');
  readonly messages: ReadonlySignal<ReadonlyMap<number, Message>> = this._messages;
  /** The settings of the chat not started yet; they go with its first send. */
  readonly draftSettings: ReadonlySignal<Settings> = this._draftSettings;
  /** The model picked for the chat not started yet (null: the default); it goes with its first send. */
  readonly draftModel: ReadonlySignal<string | null> = this._draftModel;
  /** Whether a new chat starts as a temporary one (docs/http.md, "Temporary chats"). */
  readonly temporaryMode: ReadonlySignal<boolean> = this._temporaryMode;

  constructor(
    private readonly api: ConversationsPort,
    private readonly ui: UiState,
    /** Called after a conversation's messages came from the server (the protocol resumes replies still being written). */
    private readonly onApplied: () => void = () => undefined,
  ) {}

  // ------------------------------------------------------------------ reading
  thread(key: ThreadKey = this.currentKey.value): readonly number[] {
    return this._threads.value.get(key) || NO_IDS;
  }

  hasThread(key: ThreadKey): boolean {
    return this._threads.value.has(key);
  }

  message(id: number): Message | undefined {
    return this._messages.value.get(id);
  }

  conversation(id: number | null): Conversation | undefined {
    if (id == null) return undefined;
    return this._list.value.find((c) => c.id === id) || this._searchResults.value?.find((c) => c.id === id) || this._temps.value.get(id);
  }

  /** A temporary chat (the new chat when the switch is on): not saved, not listed, not shared. */
  isTemporary(id: number | null): boolean {
    return id == null ? this._temporaryMode.value : this._temps.value.has(id);
  }

  /**
   * The model a conversation's next turn goes to: a saved one's own (undefined until the
   * conversation is known here: a turn then names none, and the server uses the stored one),
   * the new chat's pick, else `fallback` (the default model).
   */
  modelOf(id: number | null, fallback: string): string | undefined {
    if (id == null) return this._draftModel.value || fallback || undefined;
    const c = this.conversation(id);
    return c ? c.model || fallback || undefined : undefined;
  }

  /** The message still being written in a thread, if any (or the pending send awaiting its reply). */
  streamingIn(key: ThreadKey = this.currentKey.value): Message | undefined {
    for (const id of this.thread(key)) {
      const m = this.message(id);
      if (m && (m.status === 'streaming' || m.status === 'sending')) return m;
    }
    return undefined;
  }

  /** A reply is being written, or a regenerate/edit was sent and its reply has not started. */
  isBusy(key: ThreadKey = this.currentKey.value): boolean {
    return !!this.streamingIn(key) || (typeof key === 'number' && this._awaiting.value.has(key));
  }

  isLoading(id: number): boolean {
    return this._loading.value.has(id);
  }

  isLoaded(id: number): boolean {
    return this._loaded.value.has(id);
  }

  hasOlder(id: number): boolean {
    return this._older.value.has(id);
  }

  // ------------------------------------------------------------------ writing (the protocol's side)
  putMessage(m: Message): void {
    this.editMessages((all) => all.set(m.id, m));
  }

  dropMessage(id: number): void {
    if (this._messages.value.has(id)) this.editMessages((all) => all.delete(id));
  }

  setThread(key: ThreadKey, ids: readonly number[]): void {
    const next = new Map(this._threads.value);
    next.set(key, ids);
    this._threads.value = next;
  }

  /** Take a message out of a thread and forget it (an optimistic send that did not go through). */
  removeFromThread(key: ThreadKey, id: number): void {
    batch(() => {
      const t = this._threads.value.get(key);
      if (t) this.setThread(key, t.filter((x) => x !== id));
      this.dropMessage(id);
    });
  }

  upsert(c: Conversation, toTop = false): void {
    if (c.temporary || this._temps.value.has(c.id)) {
      const temps = new Map(this._temps.value);
      temps.set(c.id, { ...(temps.get(c.id) || {}), ...c });
      this._temps.value = temps;
      return;
    }
    const list = this._list.value;
    const i = list.findIndex((x) => x.id === c.id);
    if (i >= 0) {
      const merged = { ...list[i], ...c };
      const rest = list.filter((x) => x.id !== c.id);
      this._list.value = toTop ? [merged, ...rest] : list.map((x) => (x.id === c.id ? merged : x));
    } else {
      this._list.value = [c, ...list];
    }
    const found = this._searchResults.value;
    if (found) this._searchResults.value = found.map((x) => (x.id === c.id ? { ...x, ...c } : x));
  }

  /** The new chat became conversation `id` on the server: its messages, notices and draft move there. */
  bindNew(id: number): void {
    const t = this._threads.value.get('new');
    if (!t) return;
    batch(() => {
      const threads = new Map(this._threads.value);
      threads.delete('new');
      threads.set(id, t);
      this._threads.value = threads;
      this.editMessages((all) => {
        for (const mid of t) {
          const m = all.get(mid);
          if (m) all.set(mid, { ...m, conversation_id: id });
        }
      });
      this.ui.rekey('new', id);
      this._loaded.value = new Set(this._loaded.value).add(id);
      if (this._currentId.value == null) this._currentId.value = id;
      this._draftSettings.value = {};
      this._draftModel.value = null;
    });
  }

  receive(id: number): void {
    this.receiving.add(id);
  }

  stopReceiving(id: number): void {
    this.receiving.delete(id);
  }

  isReceiving(id: number): boolean {
    return this.receiving.has(id);
  }

  /** The connection changed: no reply's frames arrive any more until it is resumed. */
  forgetReceiving(): void {
    this.receiving.clear();
  }

  /** A regenerate or edit was sent in `id`: busy until its reply starts (or is refused). */
  await(id: number): void {
    this._awaiting.value = new Set(this._awaiting.value).add(id);
  }

  /** Settle one conversation, or every one (null), waiting for a reply to start. */
  settle(id: number | null): void {
    const now = this._awaiting.value;
    if (id == null ? now.size === 0 : !now.has(id)) return;
    const next = new Set(id == null ? [] : now);
    if (id != null) next.delete(id);
    this._awaiting.value = next;
  }

  /** One of the conversations awaiting a reply (an error for a refused regenerate/edit names none). */
  anyAwaiting(): number | undefined {
    return this._awaiting.value.values().next().value;
  }

  // ------------------------------------------------------------------ navigation and HTTP
  newChat(temporary?: boolean): void {
    batch(() => {
      this.leaveTemporary();
      this._currentId.value = null;
      if (temporary !== undefined) this._temporaryMode.value = temporary;
    });
  }

  /** Switch the new chat between temporary and saved (only before its first message). */
  setTemporaryMode(on: boolean): void {
    this._temporaryMode.value = on;
  }

  /** Leaving a temporary chat ends it: it is deleted on the server and forgotten here. */
  private leaveTemporary(): void {
    const id = this._currentId.value;
    if (id == null || !this._temps.value.has(id)) return;
    this.forgetTemporary(id);
    this.api.remove(id).catch(() => undefined);
  }

  /** A conversation's messages and thread, gone from what the page holds. */
  private dropThread(id: number): void {
    const gone = this.thread(id);
    this.editMessages((all) => gone.forEach((mid) => all.delete(mid)));
    const threads = new Map(this._threads.value);
    threads.delete(id);
    this._threads.value = threads;
    const loaded = new Set(this._loaded.value);
    loaded.delete(id);
    this._loaded.value = loaded;
  }

  private forgetTemporary(id: number): void {
    batch(() => {
      const temps = new Map(this._temps.value);
      temps.delete(id);
      this._temps.value = temps;
      this.dropThread(id);
      this.ui.clearThread(id);
    });
  }

  /** The socket that started this page's temporary chats closed, and the server deleted
   * them with it: forget them here too. True when the one on screen was among them. */
  endTemporaries(): boolean {
    const ids = [...this._temps.value.keys()];
    const current = this._currentId.value;
    batch(() => {
      for (const id of ids) this.forgetTemporary(id);
      if (current != null && ids.includes(current)) this._currentId.value = null;
    });
    return current != null && ids.includes(current);
  }

  /** Thumbs up or down on a reply (a null rating takes it back), with an optional comment. */
  async giveFeedback(messageId: number, rating: Rating | null, comment = ''): Promise<Result> {
    const m = this.message(messageId);
    if (!m || !this.api.feedback) return { ok: false };
    try {
      const r = await this.api.feedback(messageId, { rating, comment });
      const now = this.message(messageId);
      if (now) this.putMessage({ ...now, feedback: r.feedback });
      return { ok: true };
    } catch (e) {
      this.ui.notify(m.conversation_id, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  async select(id: number): Promise<void> {
    if (id !== this._currentId.value) this.leaveTemporary();
    this._currentId.value = id;
    if (!this.isLoaded(id)) await this.load(id);
  }

  async load(id: number, quiet = false): Promise<void> {
    if (this.isLoading(id)) return;
    this._loading.value = new Set(this._loading.value).add(id);
    try {
      const data = await this.api.get(id);
      this.apply(data.conversation, data.messages);
      // Older pages loaded before stay, and so does what was known of the rest.
      if (this.thread(id)[0] === data.messages[0]?.id) this.setOlder(id, !!data.older);
    } catch (e) {
      const err = e as ApiError;
      if (!quiet) this.ui.notify(id, err.status === 404 ? errorWords('not_found') : err.message || 'Could not load the conversation.');
    } finally {
      const loading = new Set(this._loading.value);
      loading.delete(id);
      this._loading.value = loading;
    }
  }

  /** The page of the branch before the first message loaded, put before it. */
  async loadOlder(id: number): Promise<void> {
    const first = this.thread(id).find((x) => x > 0);
    if (first == null || this.isLoading(id)) return;
    this._loading.value = new Set(this._loading.value).add(id);
    try {
      const data = await this.api.get(id, first);
      if (this.thread(id).find((x) => x > 0) !== first) return; // the branch changed meanwhile
      this.editMessages((all) => {
        for (const m of data.messages) if (!all.has(m.id)) all.set(m.id, m);
      });
      this.setThread(id, [...data.messages.map((m) => m.id), ...this.thread(id)]);
      this.setOlder(id, !!data.older);
    } catch (e) {
      this.ui.notify(id, (e as Error).message || 'Could not load the older messages.');
    } finally {
      const loading = new Set(this._loading.value);
      loading.delete(id);
      this._loading.value = loading;
    }
  }

  private setOlder(id: number, older: boolean): void {
    const next = new Set(this._older.value);
    if (older) next.add(id);
    else next.delete(id);
    this._older.value = next;
  }

  /** The server's view of a conversation's active branch (its newest page: the messages
   * loaded before that page stay when the page starts on the branch already shown). */
  apply(c: Conversation, messages: Message[]): void {
    batch(() => {
      this.upsert(c);
      const ids: number[] = [];
      const shown = this.thread(c.id);
      const start = messages.length ? shown.indexOf(messages[0].id) : -1;
      if (start > 0) ids.push(...shown.slice(0, start));
      this.editMessages((all) => {
        for (const m of messages) {
          const old = all.get(m.id);
          if (old && this.receiving.has(m.id) && old.status === 'streaming') {
            // We are receiving this reply live: our text is newer than the database's.
            all.set(m.id, { ...m, text: old.text.length >= m.text.length ? old.text : m.text, status: 'streaming' });
          } else if (old && old.status === 'streaming' && m.status === 'streaming' && old.text.length > m.text.length) {
            all.set(m.id, { ...m, text: old.text });
          } else if (!old || !sameMessage(old, m)) {
            all.set(m.id, m);
          }
          ids.push(m.id);
        }
        // keep optimistic messages not yet confirmed
        for (const id of this.thread(c.id)) if (id < 0 && all.has(id)) ids.push(id);
      });
      this.setThread(c.id, ids);
      this._loaded.value = new Set(this._loaded.value).add(c.id);
    });
    this.onApplied();
  }

  async refreshList(): Promise<void> {
    const { conversations } = await this.api.list();
    batch(() => {
      this._list.value = conversations;
      this._listLoaded.value = true;
    });
  }

  async search(q: string): Promise<void> {
    this._searchQuery.value = q;
    if (!q.trim()) {
      this._searchResults.value = null;
      return;
    }
    try {
      const { conversations } = await this.api.list(q.trim());
      if (this._searchQuery.value === q) this._searchResults.value = conversations;
    } catch (e) {
      this.ui.notify(null, (e as Error).message);
    }
  }

  async rename(id: number, title: string): Promise<Result> {
    const t = title.trim();
    if (!t) return { ok: false };
    try {
      const c = unwrapConversation(await this.api.patch(id, { title: t })).conversation;
      this.upsert({ ...(this.conversation(id) || {}), ...(c || {}), id, title: c?.title ?? t } as Conversation);
      return { ok: true };
    } catch (e) {
      this.ui.notify(null, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  /** Pin, archive or file a conversation in a folder; an archived one leaves the list,
   * an unarchived one comes back in its place by date. */
  async organise(id: number, change: Organising): Promise<Result> {
    const known = this.conversation(id) || this._archived.value?.find((c) => c.id === id);
    try {
      const c = unwrapConversation(await this.api.patch(id, change)).conversation;
      const merged = { ...(known || {}), ...(c || {}), ...change, id } as Conversation;
      batch(() => {
        const others = this._list.value.filter((x) => x.id !== id);
        const archived = this._archived.value?.filter((x) => x.id !== id) ?? null;
        if (merged.archived) {
          this._list.value = others;
          this._archived.value = archived ? [merged, ...archived] : null;
        } else {
          const when = (x: Conversation) => x.updated_at || x.created_at;
          this._list.value = [...others, merged].sort((a, b) => when(b).localeCompare(when(a)));
          this._archived.value = archived;
        }
      });
      return { ok: true };
    } catch (e) {
      this.ui.notify(null, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  async loadArchived(): Promise<void> {
    if (!this.api.listArchived) return;
    try {
      this._archived.value = (await this.api.listArchived()).conversations;
    } catch (e) {
      this.ui.notify(null, (e as Error).message);
    }
  }

  async remove(id: number): Promise<Result> {
    try {
      await this.api.remove(id);
    } catch (e) {
      const err = e as ApiError;
      if (err.status !== 404) {
        this.ui.notify(null, err.message);
        return { ok: false, error: err.message };
      }
    }
    batch(() => {
      this._list.value = this._list.value.filter((c) => c.id !== id);
      if (this._archived.value) this._archived.value = this._archived.value.filter((c) => c.id !== id);
      const found = this._searchResults.value;
      if (found) this._searchResults.value = found.filter((c) => c.id !== id);
      this.dropThread(id);
      if (this._currentId.value === id) this.newChat();
    });
    return { ok: true };
  }

  /** A saved conversation's settings are PATCHed; a new chat's are kept for its first send. */
  async saveSettings(id: number | null, settings: Settings): Promise<Result> {
    if (id == null) {
      this._draftSettings.value = { ...settings };
      return { ok: true };
    }
    try {
      const c = unwrapConversation(await this.api.patch(id, { settings })).conversation;
      this.upsert({ ...(this.conversation(id) as Conversation), ...(c || {}), id, settings: c?.settings ?? settings });
      return { ok: true };
    } catch (e) {
      return { ok: false, error: (e as Error).message };
    }
  }

  /** Pick the model of a conversation (PATCHed, so it is remembered), or of the new chat. */
  async setModel(id: number | null, model: string): Promise<Result> {
    if (id == null) {
      this._draftModel.value = model;
      return { ok: true };
    }
    const before = this.conversation(id);
    if (before) this.upsert({ ...before, model });
    try {
      const c = unwrapConversation(await this.api.patch(id, { model })).conversation;
      if (c && typeof c.model === 'string') this.upsert({ ...(this.conversation(id) as Conversation), model: c.model });
      return { ok: true };
    } catch (e) {
      if (before) this.upsert({ ...(this.conversation(id) as Conversation), model: before.model });
      return { ok: false, error: (e as Error).message };
    }
  }

  /** Show another alternative of a message (‹ 1/2 ›). */
  async showAlternative(messageId: number, delta: -1 | 1): Promise<Result> {
    const m = this.message(messageId);
    if (!m || !m.alternatives || m.conversation_id == null) return { ok: false };
    const idx = m.alternative_index ?? m.alternatives.indexOf(m.id);
    const target = m.alternatives[idx + delta];
    if (target == null) return { ok: false };
    if (this.isBusy(m.conversation_id)) {
      this.ui.notify(m.conversation_id, errorWords('already_streaming'), 'already_streaming');
      return { ok: false };
    }
    try {
      const r = unwrapConversation(await this.api.patch(m.conversation_id, { active_message: target }));
      if (r.conversation && Array.isArray(r.messages)) this.apply(r.conversation, r.messages);
      else await this.load(m.conversation_id, true);
      return { ok: true };
    } catch (e) {
      this.ui.notify(m.conversation_id, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  /** Make `messageId` (an alternative) the branch the conversation goes on from. */
  async selectMessage(convId: number, messageId: number): Promise<Result> {
    try {
      const r = unwrapConversation(await this.api.patch(convId, { active_message: messageId }));
      if (r.conversation && Array.isArray(r.messages)) this.apply(r.conversation, r.messages);
      else await this.load(convId, true);
      return { ok: true };
    } catch (e) {
      this.ui.notify(convId, (e as Error).message);
      return { ok: false, error: (e as Error).message };
    }
  }

  private editMessages(edit: (all: Map<number, Message>) => void): void {
    const next = new Map(this._messages.value);
    edit(next);
    this._messages.value = next;
  }
}

function sameMessage(a: Message, b: Message): boolean {
  return (
    a.text === b.text &&
    a.status === b.status &&
    a.finish_reason === b.finish_reason &&
    a.parent_id === b.parent_id &&
    a.alternative_index === b.alternative_index &&
    (a.error || '') === (b.error || '') &&
    (a.model || '') === (b.model || '') &&
    JSON.stringify(a.feedback || null) === JSON.stringify(b.feedback || null) &&
    JSON.stringify(a.alternatives || []) === JSON.stringify(b.alternatives || []) &&
    JSON.stringify(a.figures || {}) === JSON.stringify(b.figures || {})
  );
}

/** PATCH answers the conversation (docs/http.md) or {conversation, messages}; accept both. */
function unwrapConversation(r: unknown): { conversation?: Conversation; messages?: Message[] } {
  if (r && typeof r === 'object' && 'conversation' in r) return r as { conversation?: Conversation; messages?: Message[] };
  return { conversation: r as Conversation };
}
