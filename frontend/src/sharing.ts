import { batch, signal, type ReadonlySignal } from '@preact/signals';
import { ApiError, request } from './api';

/** A read-only link to a snapshot of a conversation (docs/http.md, "Shared links"). */
export interface SharedLink {
  url: string;
  path: string;
  conversation_id: number;
  title: string;
  created_at: string;
  /** When the snapshot the link shows was taken. */
  shared_at: string;
  message_count: number;
  show_author: boolean;
  show_settings: boolean;
  /** Only for one conversation's link: whether the conversation changed since the snapshot. */
  changed?: boolean;
}

export interface ShareOptions {
  show_author?: boolean;
  show_settings?: boolean;
}

export interface SharingPort {
  link(conversationId: number): Promise<{ share: SharedLink | null }>;
  publish(conversationId: number, options: ShareOptions): Promise<{ share: SharedLink }>;
  unpublish(conversationId: number): Promise<void>;
  links(): Promise<{ shares: SharedLink[] }>;
}

export const sharingApi: SharingPort = {
  link: (id) => request('GET', `/api/conversations/${id}/share/`),
  publish: (id, options) => request('POST', `/api/conversations/${id}/share/`, options),
  unpublish: (id) => request('DELETE', `/api/conversations/${id}/share/`),
  links: () => request('GET', '/api/shares/'),
};

const words = (e: unknown, fallback: string) => (e instanceof Error && e.message) || fallback;

/** One conversation's link, for its Share dialog: undefined while loading, null when the
 * conversation is not shared. */
export class ConversationLink {
  private readonly _link = signal<SharedLink | null | undefined>(undefined);
  private readonly _busy = signal(false);
  private readonly _error = signal('');
  readonly link: ReadonlySignal<SharedLink | null | undefined> = this._link;
  readonly busy: ReadonlySignal<boolean> = this._busy;
  readonly error: ReadonlySignal<string> = this._error;

  constructor(
    private readonly api: SharingPort,
    readonly conversationId: number,
  ) {}

  async load(): Promise<void> {
    await this.run(async () => {
      this._link.value = (await this.api.link(this.conversationId)).share;
    }, 'Could not load the link of this conversation.');
  }

  /** Share now, or update the link to the conversation as it is now (same address). */
  async publish(options: ShareOptions): Promise<boolean> {
    return this.run(async () => {
      this._link.value = (await this.api.publish(this.conversationId, options)).share;
    }, 'Could not share the conversation.');
  }

  /** Stop sharing: the link stops working; sharing again makes a new one. */
  async revoke(): Promise<boolean> {
    return this.run(async () => {
      await this.api.unpublish(this.conversationId);
      this._link.value = null;
    }, 'Could not stop sharing the conversation.');
  }

  private async run(step: () => Promise<void>, fallback: string): Promise<boolean> {
    batch(() => {
      this._busy.value = true;
      this._error.value = '';
    });
    try {
      await step();
      return true;
    } catch (e) {
      this._error.value = words(e, fallback);
      if (this._link.value === undefined) this._link.value = null;
      return false;
    } finally {
      this._busy.value = false;
    }
  }
}

/** Every link the person made, for the account dialog: null while loading. */
export class SharedLinks {
  private readonly _list = signal<readonly SharedLink[] | null>(null);
  private readonly _error = signal('');
  readonly list: ReadonlySignal<readonly SharedLink[] | null> = this._list;
  readonly error: ReadonlySignal<string> = this._error;

  constructor(private readonly api: SharingPort) {}

  async load(): Promise<void> {
    try {
      const { shares } = await this.api.links();
      batch(() => {
        this._list.value = shares;
        this._error.value = '';
      });
    } catch (e) {
      batch(() => {
        this._list.value = this._list.value ?? [];
        this._error.value = words(e, 'Could not load your shared links.');
      });
    }
  }

  async revoke(conversationId: number): Promise<boolean> {
    try {
      await this.api.unpublish(conversationId);
    } catch (e) {
      // Already gone (revoked elsewhere, or the conversation deleted): it is off the list too.
      if (!(e instanceof ApiError && e.status === 404)) {
        this._error.value = words(e, 'Could not stop sharing.');
        return false;
      }
    }
    batch(() => {
      this._list.value = (this._list.value ?? []).filter((s) => s.conversation_id !== conversationId);
      this._error.value = '';
    });
    return true;
  }
}
