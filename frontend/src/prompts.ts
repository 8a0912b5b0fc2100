import { signal, type ReadonlySignal } from '@preact/signals';
import { request } from './api';

/** A saved prompt (docs/http.md, "Saved prompts"): `/name` in the composer puts its text in the box. */
export interface SavedPrompt {
  id: number;
  name: string;
  text: string;
}

export interface PromptsPort {
  list(): Promise<{ prompts: SavedPrompt[] }>;
  create(body: { name: string; text: string }): Promise<SavedPrompt>;
  update(id: number, body: { name?: string; text?: string }): Promise<SavedPrompt>;
  remove(id: number): Promise<void>;
}

export const promptsApi: PromptsPort = {
  list: () => request('GET', '/api/prompts/'),
  create: (body) => request('POST', '/api/prompts/', body),
  update: (id, body) => request('PATCH', `/api/prompts/${id}/`, body),
  remove: (id) => request('DELETE', `/api/prompts/${id}/`),
};

/** The word being typed after a `/` that starts the message ("/sum" → "sum"), or null. */
export function slashQuery(text: string): string | null {
  const m = /^\/([a-z0-9-]*)$/i.exec(text);
  return m ? m[1].toLowerCase() : null;
}

/** Prompts whose name starts with the query first, then those that contain it. */
export function matching(prompts: readonly SavedPrompt[], query: string): SavedPrompt[] {
  const q = query.toLowerCase();
  const starts = prompts.filter((p) => p.name.startsWith(q));
  const contains = prompts.filter((p) => !p.name.startsWith(q) && (p.name.includes(q) || p.text.toLowerCase().includes(q)));
  return [...starts, ...contains];
}

/** The user's saved prompts, loaded once when first needed. */
export class SavedPrompts {
  private readonly _list = signal<readonly SavedPrompt[]>([]);
  private loading: Promise<void> | null = null;
  readonly list: ReadonlySignal<readonly SavedPrompt[]> = this._list;

  constructor(private readonly api: PromptsPort = promptsApi) {}

  /** Load them (once; `again` reloads). */
  load(again = false): Promise<void> {
    if (!this.loading || again) {
      this.loading = this.api.list().then(
        (r) => {
          this._list.value = r.prompts;
        },
        (e) => {
          this.loading = null;
          throw e;
        },
      );
    }
    return this.loading;
  }

  async create(name: string, text: string): Promise<SavedPrompt> {
    const p = await this.api.create({ name, text });
    this._list.value = [...this._list.value.filter((x) => x.id !== p.id), p].sort((a, b) => a.name.localeCompare(b.name));
    return p;
  }

  async update(id: number, body: { name?: string; text?: string }): Promise<SavedPrompt> {
    const p = await this.api.update(id, body);
    this._list.value = this._list.value.map((x) => (x.id === id ? p : x)).sort((a, b) => a.name.localeCompare(b.name));
    return p;
  }

  async remove(id: number): Promise<void> {
    await this.api.remove(id);
    this._list.value = this._list.value.filter((x) => x.id !== id);
  }
}
