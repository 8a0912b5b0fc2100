import { signal, type ReadonlySignal } from '@preact/signals';
import type { ConnState } from './ws';

/** A conversation id, or 'new' for a chat that has no server conversation yet. */
export type ThreadKey = number | 'new';

export interface Notice {
  id: number;
  text: string;
  code?: string;
}

let lastNoticeId = 0;
const NO_NOTICES: readonly Notice[] = [];

/**
 * What the page shows around the conversations: the connection state, the notices of each
 * thread and the toasts of none, and the composer's drafts. Views read the signals; only
 * the methods write them.
 */
export class UiState {
  private readonly _conn = signal<ConnState>('connecting');
  private readonly _notices = signal<ReadonlyMap<ThreadKey, readonly Notice[]>>(new Map());
  private readonly _toasts = signal<readonly Notice[]>([]);
  private readonly _draftRestored = signal(0);
  /** Not reactive: the composer owns its text while the person types. */
  private readonly drafts = new Map<ThreadKey, string>();

  readonly conn: ReadonlySignal<ConnState> = this._conn;
  readonly toasts: ReadonlySignal<readonly Notice[]> = this._toasts;
  /** Bumped when a thread's draft is set from outside the composer (a failed send put back). */
  readonly draftRestored: ReadonlySignal<number> = this._draftRestored;

  setConn(state: ConnState): void {
    this._conn.value = state;
  }

  // ------------------------------------------------------------------ notices
  /** A notice in a thread, or a toast when it belongs to none (key null). */
  notify(key: ThreadKey | null, text: string, code?: string): void {
    const n = { id: ++lastNoticeId, text, code };
    if (key == null) {
      this._toasts.value = [...this._toasts.value, n].slice(-4);
    } else {
      this.setNotices(key, [...this.noticesFor(key), n].slice(-3));
    }
  }

  noticesFor(key: ThreadKey): readonly Notice[] {
    return this._notices.value.get(key) || NO_NOTICES;
  }

  dismiss(id: number): void {
    this._toasts.value = this._toasts.value.filter((t) => t.id !== id);
    this.filterNotices((n) => n.id !== id);
  }

  /** Drop every notice with this code, in all threads. */
  clearNotices(code: string): void {
    this.filterNotices((n) => n.code !== code);
  }

  clearThread(key: ThreadKey): void {
    if (!this._notices.value.has(key)) return;
    const next = new Map(this._notices.value);
    next.delete(key);
    this._notices.value = next;
  }

  // ------------------------------------------------------------------ drafts
  getDraft(key: ThreadKey): string {
    return this.drafts.get(key) || '';
  }

  /** The composer's text of a thread; `fromOutside` makes the composer show it. */
  setDraft(key: ThreadKey, text: string, fromOutside = false): void {
    this.drafts.set(key, text);
    if (fromOutside) this._draftRestored.value++;
  }

  /** The new chat became conversation `id`: its notices and draft go with it. */
  rekey(from: ThreadKey, to: ThreadKey): void {
    const n = this._notices.value.get(from);
    if (n) {
      const next = new Map(this._notices.value);
      next.delete(from);
      next.set(to, n);
      this._notices.value = next;
    }
    const d = this.drafts.get(from);
    this.drafts.delete(from);
    if (d) this.drafts.set(to, d);
  }

  private setNotices(key: ThreadKey, list: readonly Notice[]): void {
    const next = new Map(this._notices.value);
    next.set(key, list);
    this._notices.value = next;
  }

  private filterNotices(keep: (n: Notice) => boolean): void {
    let next: Map<ThreadKey, readonly Notice[]> | null = null;
    for (const [k, list] of this._notices.value) {
      const kept = list.filter(keep);
      if (kept.length === list.length) continue;
      next ??= new Map(this._notices.value);
      next.set(k, kept);
    }
    if (next) this._notices.value = next;
  }
}
