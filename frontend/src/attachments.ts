import { batch, signal, type ReadonlySignal } from '@preact/signals';
import type { AttachmentInfo, PromptSize, Settings } from './types';
import type { ThreadKey } from './ui-state';

/** The server's side of documents (docs/http.md, "Attachments"). */
export interface AttachmentsPort {
  uploadAttachment(file: File): Promise<AttachmentInfo>;
  attachment(id: number): Promise<AttachmentInfo & { text: string }>;
  removeAttachment(id: number): Promise<void>;
  promptSize(body: { conversation_id: number | null; text: string; attachments: number[]; settings?: Settings; model?: string }): Promise<PromptSize>;
}

/** A file in the composer: being read by the server, ready to go with the message, or refused. */
export interface DraftAttachment {
  /** Local key (the server id once uploaded does not exist while it uploads). */
  key: string;
  name: string;
  size: number;
  status: 'uploading' | 'ready' | 'error';
  info?: AttachmentInfo;
  error?: string;
}

/** What the composer shows about the prompt it would send. */
export interface Measure {
  size: PromptSize | null;
  /** A count is on its way (the numbers shown are from before). */
  pending: boolean;
}

const NONE: readonly DraftAttachment[] = [];
const MEASURE_DELAY_MS = 250;
let lastKey = 0;

/** "1.2 MB", the same units the server's messages use. */
export function humanSize(n: number): string {
  if (n < 1000) return `${n} bytes`;
  let value = n;
  for (const unit of ['KB', 'MB', 'GB']) {
    value /= 1000;
    if (value < 1000 || unit === 'GB') return `${value.toFixed(1)} ${unit}`;
  }
  return `${n} bytes`;
}

export const tokenWords = (n: number | null | undefined): string =>
  n == null ? '' : `${n.toLocaleString('en-US')} token${n === 1 ? '' : 's'}`;

/**
 * Documents in the composer, per thread: uploaded as they are attached (by the button, a
 * drop or a paste), counted against the model's context window before sending, handed to
 * the send (`take`) and given back if the send did not go through (`restore`).
 */
export class Attachments {
  private readonly _drafts = signal<ReadonlyMap<ThreadKey, readonly DraftAttachment[]>>(new Map());
  private readonly _measures = signal<ReadonlyMap<ThreadKey, Measure>>(new Map());
  private readonly texts = new Map<number, Promise<string>>();
  private readonly timers = new Map<ThreadKey, ReturnType<typeof setTimeout>>();
  private readonly asked = new Map<ThreadKey, number>();

  readonly drafts: ReadonlySignal<ReadonlyMap<ThreadKey, readonly DraftAttachment[]>> = this._drafts;

  constructor(private readonly api: AttachmentsPort) {}

  draftsFor(key: ThreadKey): readonly DraftAttachment[] {
    return this._drafts.value.get(key) || NONE;
  }

  /** The documents ready to go with the next message. */
  ready(key: ThreadKey): AttachmentInfo[] {
    return this.draftsFor(key).flatMap((d) => (d.status === 'ready' && d.info ? [d.info] : []));
  }

  uploading(key: ThreadKey): boolean {
    return this.draftsFor(key).some((d) => d.status === 'uploading');
  }

  measureFor(key: ThreadKey): Measure | undefined {
    return this._measures.value.get(key);
  }

  /** Upload each file; a refused one stays as a chip saying why until it is removed. */
  async add(key: ThreadKey, files: Iterable<File>, limit = Infinity): Promise<void> {
    const jobs: Promise<void>[] = [];
    for (const file of files) {
      const draft: DraftAttachment = { key: 'a' + ++lastKey, name: file.name || 'pasted text', size: file.size, status: 'uploading' };
      const count = this.draftsFor(key).filter((d) => d.status !== 'error').length;
      if (count >= limit) {
        this.put(key, { ...draft, status: 'error', error: `At most ${limit} files can go with one message.` });
        continue;
      }
      this.put(key, draft);
      jobs.push(
        this.api.uploadAttachment(file).then(
          (info) => this.replace(key, draft.key, { ...draft, status: 'ready', info, size: info.size, name: info.name }),
          (e: Error) => this.replace(key, draft.key, { ...draft, status: 'error', error: e.message || 'The file could not be attached.' }),
        ),
      );
    }
    await Promise.all(jobs);
  }

  /** Take a chip off (and the server's copy of a file not sent). */
  remove(key: ThreadKey, draftKey: string): void {
    const d = this.draftsFor(key).find((x) => x.key === draftKey);
    if (!d) return;
    this.setDrafts(key, this.draftsFor(key).filter((x) => x.key !== draftKey));
    if (d.info) this.api.removeAttachment(d.info.id).catch(() => undefined);
  }

  /** The documents for the message being sent: out of the composer. */
  take(key: ThreadKey): AttachmentInfo[] {
    const docs = this.ready(key);
    batch(() => {
      this.setDrafts(key, this.draftsFor(key).filter((d) => d.status === 'uploading'));
      this.setMeasure(key, undefined);
    });
    return docs;
  }

  /** A send that did not go through: its documents back in the composer. */
  restore(key: ThreadKey, docs: readonly AttachmentInfo[]): void {
    if (!docs.length) return;
    const back = docs.map((info): DraftAttachment => ({ key: 'a' + ++lastKey, name: info.name, size: info.size, status: 'ready', info }));
    this.setDrafts(key, [...back, ...this.draftsFor(key)]);
  }

  /**
   * Count what a send would put before the model, a moment after the last change (each
   * keystroke does not ask). Only the newest answer is kept.
   */
  measure(key: ThreadKey, body: { conversation_id: number | null; text: string; settings?: Settings; model?: string }, wanted: boolean): void {
    const timer = this.timers.get(key);
    if (timer) clearTimeout(timer);
    if (!wanted) {
      this.asked.set(key, (this.asked.get(key) ?? 0) + 1);
      if (this.measureFor(key)) this.setMeasure(key, undefined);
      return;
    }
    const before = this.measureFor(key);
    this.setMeasure(key, { size: before?.size ?? null, pending: true });
    this.timers.set(
      key,
      setTimeout(() => {
        const n = (this.asked.get(key) ?? 0) + 1;
        this.asked.set(key, n);
        const attachments = this.ready(key).map((a) => a.id);
        this.api.promptSize({ ...body, attachments }).then(
          (size) => {
            if (this.asked.get(key) === n) this.setMeasure(key, { size, pending: false });
          },
          () => {
            if (this.asked.get(key) === n) this.setMeasure(key, { size: null, pending: false });
          },
        );
      }, MEASURE_DELAY_MS),
    );
  }

  /** A stored document's text (asked for once). */
  text(id: number): Promise<string> {
    let t = this.texts.get(id);
    if (!t) {
      t = this.api.attachment(id).then((a) => a.text);
      t.catch(() => this.texts.delete(id));
      this.texts.set(id, t);
    }
    return t;
  }

  private put(key: ThreadKey, d: DraftAttachment): void {
    this.setDrafts(key, [...this.draftsFor(key), d]);
  }

  private replace(key: ThreadKey, draftKey: string, d: DraftAttachment): void {
    const list = this.draftsFor(key);
    if (!list.some((x) => x.key === draftKey)) {
      // Removed while it uploaded: the server's copy is not wanted either.
      if (d.info) this.api.removeAttachment(d.info.id).catch(() => undefined);
      return;
    }
    this.setDrafts(key, list.map((x) => (x.key === draftKey ? d : x)));
  }

  private setDrafts(key: ThreadKey, list: readonly DraftAttachment[]): void {
    const next = new Map(this._drafts.value);
    if (list.length) next.set(key, list);
    else next.delete(key);
    this._drafts.value = next;
  }

  private setMeasure(key: ThreadKey, m: Measure | undefined): void {
    const next = new Map(this._measures.value);
    if (m) next.set(key, m);
    else next.delete(key);
    this._measures.value = next;
  }
}
