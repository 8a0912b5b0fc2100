import { useState } from 'preact/hooks';
import { humanSize, tokenWords, type DraftAttachment, type Measure } from '../attachments';
import type { AttachmentInfo, Source } from '../types';
import { useChat } from './hooks';

export const PaperclipIcon = () => (
  <svg width={18} height={18} viewBox="0 0 24 24" fill="none" stroke="currentColor" stroke-width={2} stroke-linecap="round" stroke-linejoin="round" aria-hidden="true" class="icon">
    <path d="M21 11.5 12.5 20a5 5 0 0 1-7-7L14 4.5a3.3 3.3 0 0 1 4.7 4.7L10.2 17.7a1.7 1.7 0 0 1-2.4-2.4L15.5 7.6" />
  </svg>
);

/** What a chip says of a document: its size, and its tokens where known. */
const facts = (size: number, tokens: number | null | undefined) => [humanSize(size), tokenWords(tokens)].filter(Boolean).join(' · ');

/** The files in the composer: uploading, ready (size, tokens) or refused (why), each removable. */
export function DraftChips({ drafts, onRemove, tokens }: { drafts: readonly DraftAttachment[]; onRemove: (key: string) => void; tokens: Map<number, number | null> }) {
  if (!drafts.length) return null;
  return (
    <ul class="chips draft-chips" data-testid="composer-attachments" aria-label="Attached files">
      {drafts.map((d) => (
        <li key={d.key} class={'chip chip-' + d.status} data-testid="draft-attachment" data-status={d.status} data-name={d.name}>
          <span class="chip-name">{d.name}</span>
          <span class="chip-facts" data-testid="draft-attachment-facts">
            {d.status === 'uploading' ? 'reading…' : d.status === 'error' ? '' : facts(d.size, d.info ? tokens.get(d.info.id) ?? d.info.tokens : null)}
          </span>
          {d.status === 'error' ? (
            <span class="chip-error" role="alert" data-testid="draft-attachment-error">{d.error}</span>
          ) : null}
          <button type="button" class="chip-remove" data-testid="draft-attachment-remove" aria-label={'Remove ' + d.name} title="Remove" onClick={() => onRemove(d.key)}>
            ×
          </button>
        </li>
      ))}
    </ul>
  );
}

/** The prompt a send would make, counted by the server: tokens against the context window, and why it does not fit. */
export function PromptCount({ m }: { m: Measure | undefined }) {
  const size = m?.size;
  if (!m || (!size && !m.pending)) return null;
  const n = (x: number) => x.toLocaleString('en-US');
  return (
    <div class="prompt-count" data-testid="prompt-count" data-fits={size ? String(size.fits) : 'unknown'} data-pending={m.pending ? 'true' : 'false'}>
      {size && size.prompt_tokens != null ? (
        <span data-testid="prompt-tokens" data-tokens={size.prompt_tokens}>
          To send: {n(size.prompt_tokens)} tokens with the conversation so far
          {size.context_tokens ? ` (the model reads at most ${n(size.context_tokens)})` : ''}
        </span>
      ) : (
        <span class="muted">Counting tokens…</span>
      )}
      {size && !size.fits && size.message ? (
        <div class="context-warning" role="alert" data-testid="context-warning">{size.message}</div>
      ) : null}
      {size?.fits && size.passages ? (
        <div class="passages-note" data-testid="passages-note">
          Too long to read whole: the {n(size.passages)} passages most relevant to your message go instead, and the reply lists them.
        </div>
      ) : null}
    </div>
  );
}

/** A sent message's documents: a chip each (name, size, tokens); a click shows its text. */
export function MessageAttachments({ docs }: { docs: readonly AttachmentInfo[] }) {
  const { attachments } = useChat();
  const [open, setOpen] = useState<number | null>(null);
  const [text, setText] = useState<{ id: number; text: string } | { id: number; error: string } | null>(null);
  if (!docs.length) return null;
  const show = (id: number) => {
    if (open === id) return setOpen(null);
    setOpen(id);
    if (text?.id === id && 'text' in text) return;
    setText(null);
    attachments.text(id).then(
      (t) => setText({ id, text: t }),
      (e: Error) => setText({ id, error: e.message || 'The document could not be loaded.' }),
    );
  };
  const shown = open != null ? docs.find((d) => d.id === open) : undefined;
  return (
    <div class="msg-attachments">
      <ul class="chips" aria-label="Attached files">
        {docs.map((d) => (
          <li key={d.id}>
            <button
              type="button"
              class={'chip chip-ready' + (open === d.id ? ' chip-open' : '')}
              data-testid="attachment-chip"
              data-attachment-id={String(d.id)}
              aria-expanded={open === d.id}
              title={'Show the text of ' + d.name}
              disabled={d.id <= 0}
              onClick={() => show(d.id)}
            >
              <span class="chip-name">{d.name}</span>
              <span class="chip-facts">{facts(d.size, d.tokens)}</span>
            </button>
          </li>
        ))}
      </ul>
      {shown ? (
        <div class="attachment-text" data-testid="attachment-text" role="region" aria-label={'Text of ' + shown.name}>
          {text && text.id === shown.id ? (
            'text' in text ? <pre>{text.text}</pre> : <p class="chip-error">{text.error}</p>
          ) : (
            <p class="muted">Loading…</p>
          )}
        </div>
      ) : null}
    </div>
  );
}

/** The passages a message sent in place of documents too long to read whole: a number,
 * the document and its page each; a click shows the passage. */
export function MessageSources({ sources }: { sources: readonly Source[] }) {
  const [open, setOpen] = useState<number | null>(null);
  if (!sources.length) return null;
  const shown = sources.find((s) => s.n === open);
  return (
    <div class="sources" data-testid="message-sources">
      <span class="sources-label">Passages used:</span>
      <ul class="chips">
        {sources.map((s) => (
          <li key={s.n}>
            <button type="button" class="chip" data-testid="source-item" data-page={s.page ?? ''} aria-expanded={open === s.n} onClick={() => setOpen(open === s.n ? null : s.n)}>
              [{s.n}] {s.name}
              {s.page ? `, p. ${s.page}` : ''}
            </button>
          </li>
        ))}
      </ul>
      {shown ? (
        <blockquote class="source-text" data-testid="source-text">
          {shown.text}
        </blockquote>
      ) : null}
    </div>
  );
}
