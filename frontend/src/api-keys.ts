import { batch, signal, type ReadonlySignal } from '@preact/signals';
import { ApiError, request } from './api';

/** An API key as the server lists it: never the key itself (docs/http.md, "API keys"). */
export interface ApiKeyInfo {
  id: number;
  name: string;
  /** The key's first characters, to tell keys apart. */
  prefix: string;
  created_at: string;
  last_used_at: string | null;
}

/** A key just made: `secret` is the key itself, shown once and never sent again. */
export interface NewKey {
  key: ApiKeyInfo;
  secret: string;
}

export interface KeysPort {
  keys(): Promise<{ keys: ApiKeyInfo[]; max_keys: number }>;
  createKey(name: string): Promise<NewKey>;
  revokeKey(id: number): Promise<void>;
}

export const keysApi: KeysPort = {
  keys: () => request('GET', '/api/keys/'),
  createKey: (name) => request('POST', '/api/keys/', { name }),
  revokeKey: (id) => request('DELETE', `/api/keys/${id}/`),
};

export const KEY_NAME_MAX_CHARS = 100;

/** What is wrong with a new key's name, in words, or '' when it can be sent. */
export function keyNameProblem(name: string): string {
  if (!name.trim()) return 'Give the key a name: what will use it (e.g. “laptop script”).';
  if (name.trim().length > KEY_NAME_MAX_CHARS) return `A key’s name is at most ${KEY_NAME_MAX_CHARS} characters.`;
  return '';
}

/**
 * The person's API keys, for the account dialog. A key just made is kept in `created`
 * (the only time the app holds it) until `forget`: the dialog shows it once.
 */
export class ApiKeys {
  private readonly _list = signal<readonly ApiKeyInfo[] | null>(null);
  private readonly _maxKeys = signal<number | null>(null);
  private readonly _created = signal<NewKey | null>(null);
  private readonly _busy = signal(false);
  private readonly _error = signal('');
  /** null while loading. */
  readonly list: ReadonlySignal<readonly ApiKeyInfo[] | null> = this._list;
  readonly maxKeys: ReadonlySignal<number | null> = this._maxKeys;
  readonly created: ReadonlySignal<NewKey | null> = this._created;
  readonly busy: ReadonlySignal<boolean> = this._busy;
  readonly error: ReadonlySignal<string> = this._error;

  constructor(private readonly api: KeysPort) {}

  async load(): Promise<void> {
    try {
      const { keys, max_keys } = await this.api.keys();
      batch(() => {
        this._list.value = keys;
        this._maxKeys.value = max_keys;
      });
    } catch (e) {
      batch(() => {
        this._list.value = this._list.value ?? [];
        this._error.value = e instanceof Error ? e.message : 'Could not load your API keys.';
      });
    }
  }

  /** Make a key; false (with `error` saying why: a bad name, too many keys) when none was made. */
  async create(name: string): Promise<boolean> {
    const problem = keyNameProblem(name);
    if (problem) {
      this._error.value = problem;
      return false;
    }
    batch(() => {
      this._busy.value = true;
      this._error.value = '';
      this._created.value = null;
    });
    try {
      const made = await this.api.createKey(name.trim());
      batch(() => {
        this._created.value = made;
        this._list.value = [made.key, ...(this._list.value ?? [])];
      });
      return true;
    } catch (e) {
      this._error.value = e instanceof Error ? e.message : 'Could not create the key.';
      return false;
    } finally {
      this._busy.value = false;
    }
  }

  async revoke(id: number): Promise<boolean> {
    try {
      await this.api.revokeKey(id);
    } catch (e) {
      // Already revoked elsewhere: it is gone from the list too.
      if (!(e instanceof ApiError && e.status === 404)) {
        this._error.value = e instanceof Error ? e.message : 'Could not revoke the key.';
        return false;
      }
    }
    batch(() => {
      this._list.value = (this._list.value ?? []).filter((k) => k.id !== id);
      if (this._created.value?.key.id === id) this._created.value = null;
      this._error.value = '';
    });
    return true;
  }

  /** Drop the new key's secret: from now on only its prefix is known here. */
  forget(): void {
    this._created.value = null;
  }
}
