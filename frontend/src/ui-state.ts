import { signal, type ReadonlySignal, type Signal } from '@preact/signals';
import type { ConnState } from './ws';

/** A conversation id, or 'new' for a chat that has no server conversation yet. */
export type ThreadKey = number | 'new';

export interface Notice {
  id: number;
  text: string;
  code?: string;
}

const FIGURES_KEY = 'chat.figures';

/** The person's choice about reply figures in this browser, if they made one. */
function storedFigures(): boolean | null {
  try {
    const v = localStorage.getItem(FIGURES_KEY);
    return v === 'on' ? true : v === 'off' ? false : null;
  } catch {
    return null;
  }
}

let lastNoticeId = 0;
const NO_NOTICES: readonly Notice[] = [];

/**
 * What the page shows around the conversations: the connection state, the notices of each
 * thread and the toasts of none, the composer's drafts, and whether replies show their
 * figures. Views read the signals; only the methods write them.
 */
export class UiState {
  private readonly _conn = signal<ConnState>('connecting');
  private readonly _notices = signal<ReadonlyMap<ThreadKey, readonly Notice[]>>(new Map());
  private readonly _toasts = signal<readonly Notice[]>([]);
  private readonly _draftRestored = signal(0);
  /** Not reactive: the composer owns its text while the person types. */
  private readonly drafts = new Map<ThreadKey, string>();
  private readonly _showFigures: Signal<boolean>;
  private readonly _announcement = signal<{ id: number; text: string } | null>(null);

  readonly conn: ReadonlySignal<ConnState> = this._conn;
  readonly toasts: ReadonlySignal<readonly Notice[]> = this._toasts;
  /** Bumped when a thread's draft is set from outside the composer (a failed send put back). */
  readonly draftRestored: ReadonlySignal<number> = this._draftRestored;
  /** The developer figures under each reply (TTFT, speed, tokens, cached): remembered in this
   * browser once chosen, on by default for staff and off for everyone else. */
  readonly showFigures: ReadonlySignal<boolean>;
  /** What the polite live region says now: a reply that finished, once (never each token). */
  readonly announcement: ReadonlySignal<{ id: number; text: string } | null> = this._announcement;

  constructor(opts: { staff?: boolean } = {}) {
    this._showFigures = signal<boolean>(storedFigures() ?? !!opts.staff);
    this.showFigures = this._showFigures;
  }

  setShowFigures(on: boolean): void {
    this._showFigures.value = on;
    try {
      localStorage.setItem(FIGURES_KEY, on ? 'on' : 'off');
    } catch {
      /* private mode: the choice lasts for this page */
    }
  }

  setConn(state: ConnState): void {
    this._conn.value = state;
  }

  /** Say this to a screen reader once, politely (the live region reads each new text). */
  announce(text: string): void {
    this._announcement.value = { id: (this._announcement.value?.id ?? 0) + 1, text };
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
