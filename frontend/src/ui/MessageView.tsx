import { memo } from 'preact/compat';
import { useLayoutEffect, useMemo, useRef, useState } from 'preact/hooks';
import { formatFigures, hasFigures } from '../format';
import { renderMarkdown } from '../markdown';
import { applyMathStyles } from '../math';
import { canSpeak, speakableText, speaking, toggleSpeech } from '../speech';
import type { Message, Rating } from '../types';
import { MessageAttachments, MessageSources } from './Attachments';
import { copyText } from './clipboard';
import { ThumbDownIcon, ThumbUpIcon } from './icons';

export interface MessageActions {
  /** Thumbs up or down on a reply (null takes it back), with an optional comment. */
  feedback(id: number, rating: Rating | null, comment?: string): Promise<boolean>;
  regenerate(id: number): void;
  continueReply(id: number): void;
  edit(id: number, text: string): boolean;
  alternative(id: number, delta: -1 | 1): void;
}

interface Props {
  m: Message;
  busy: boolean;
  actions: MessageActions;
  /** Show the reply's figures (a setting, ui-state.ts). */
  figures: boolean;
  /** The last message of the branch shown: only it can be written on (Continue). */
  last?: boolean;
  /** Being written, but the connection is down: these words stand in for the cursor (paused.ts). */
  paused?: string;
}

const FINISH_WORDS: Record<string, string> = {
  length: 'Stopped at the length limit.',
  abort: 'Stopped.',
  disconnect: 'Cut short: the connection was lost.',
  error: 'Cut short by an error.',
  interrupted: 'Interrupted: the server restarted while writing this reply. It is kept as far as it got.',
};

/** 👍 / 👎 on a reply, and a comment box that opens after either (optional: Skip closes it). */
function FeedbackButtons({ m, actions }: { m: Message; actions: MessageActions }) {
  const given = m.feedback?.rating ?? null;
  const [asking, setAsking] = useState<Rating | null>(null);
  const [comment, setComment] = useState('');
  const [thanks, setThanks] = useState(false);
  const box = useRef<HTMLTextAreaElement>(null);
  const rate = async (r: Rating) => {
    if (given === r) {
      // Pressed again: taken back.
      setAsking(null);
      await actions.feedback(m.id, null);
      return;
    }
    if (await actions.feedback(m.id, r, '')) {
      setComment('');
      setAsking(r);
      setThanks(false);
      setTimeout(() => box.current?.focus(), 0);
    }
  };
  const sendComment = async () => {
    if (asking && comment.trim() && (await actions.feedback(m.id, asking, comment))) {
      setAsking(null);
      setThanks(true);
    }
  };
  return (
    <>
      <button type="button" class={'icon-btn thumb' + (given === 'up' ? ' on' : '')} data-testid="feedback-up" aria-label="Good reply" aria-pressed={given === 'up'} title="Good reply" onClick={() => void rate('up')}>
        <ThumbUpIcon on={given === 'up'} />
      </button>
      <button type="button" class={'icon-btn thumb' + (given === 'down' ? ' on' : '')} data-testid="feedback-down" aria-label="Bad reply" aria-pressed={given === 'down'} title="Bad reply" onClick={() => void rate('down')}>
        <ThumbDownIcon on={given === 'down'} />
      </button>
      {asking ? (
        <span class="feedback-box" role="group" aria-label="Tell us more" data-testid="feedback-form">
          <textarea
            ref={box}
            rows={2}
            maxLength={2000}
            data-testid="feedback-comment"
            aria-label={asking === 'up' ? 'What was good about this reply? (optional)' : 'What was wrong with this reply? (optional)'}
            placeholder={asking === 'up' ? 'What was good? (optional)' : 'What was wrong? (optional)'}
            value={comment}
            onInput={(e) => setComment((e.target as HTMLTextAreaElement).value)}
            onKeyDown={(e) => {
              if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
                e.preventDefault();
                void sendComment();
              } else if (e.key === 'Escape') {
                e.stopPropagation();
                setAsking(null);
              }
            }}
          />
          <button type="button" class="btn small primary" data-testid="feedback-send" disabled={!comment.trim()} onClick={() => void sendComment()}>Send</button>
          <button type="button" class="btn small" data-testid="feedback-skip" onClick={() => setAsking(null)}>Skip</button>
        </span>
      ) : thanks ? (
        <span class="muted feedback-thanks" role="status" data-testid="feedback-thanks">Thanks for the feedback.</span>
      ) : null}
    </>
  );
}

function ReadAloud({ m, content }: { m: Message; content: { current: HTMLElement | null } }) {
  const on = speaking.value === m.id;
  return (
    <button
      type="button"
      class="icon-btn"
      data-testid="message-read-aloud"
      aria-pressed={on}
      aria-label={on ? 'Stop reading aloud' : 'Read aloud'}
      title={on ? 'Stop reading' : 'Read aloud (your browser\'s voice)'}
      onClick={() => {
        const md = content.current?.querySelector<HTMLElement>('.md');
        toggleSpeech(m.id, md ? speakableText(md) : m.text);
      }}
    >
      {on ? 'Stop reading' : 'Read aloud'}
    </button>
  );
}

function Markdown({ text, streaming }: { text: string; streaming: boolean }) {
  const html = useMemo(() => renderMarkdown(text, streaming), [text, streaming]);
  const box = useRef<HTMLDivElement>(null);
  useLayoutEffect(() => {
    if (box.current) applyMathStyles(box.current);
  }, [html]);
  return <div class="md" ref={box} data-testid="message-content" dangerouslySetInnerHTML={{ __html: html }} />;
}

/** A reply the server replayed from its response cache instead of generating it again. */
function ReplayedMark() {
  return (
    <span
      class="figure replayed-mark"
      data-testid="replayed-mark"
      title="Replayed from the response cache: the same request (same prompt, model and settings, not sampled at random) was answered before, so this reply was not generated again."
    >
      ⟲ cached reply
    </span>
  );
}

function Figures({ m, paused }: { m: Message; paused?: string }) {
  if (m.role !== 'assistant') return null;
  const show = hasFigures(m.figures);
  return (
    <div class="figures" data-testid="message-figures" data-ready={show ? 'true' : 'false'} aria-label="Reply figures">
      {show && m.figures?.replayed ? <ReplayedMark /> : null}
      {show
        ? formatFigures(m.figures).map((f) => (
            <span class="figure" key={f.key} data-figure={f.key} title={f.title}>
              <span class="figure-label">{f.label}</span> {f.value}
            </span>
          ))
        : m.status === 'streaming'
          ? <span class="figure muted">{paused ? 'paused' : 'writing…'}</span>
          : null}
    </div>
  );
}

function Alternatives({ m, busy, actions }: Omit<Props, 'figures'>) {
  const alts = m.alternatives;
  if (!alts || alts.length < 2) return null;
  const idx = m.alternative_index ?? Math.max(0, alts.indexOf(m.id));
  return (
    <span class="alts" data-testid="alternatives">
      <button type="button" class="icon-btn" data-testid="alt-prev" aria-label="Previous version" disabled={busy || idx <= 0} onClick={() => actions.alternative(m.id, -1)}>‹</button>
      <span class="alt-counter" data-testid="alt-counter">{idx + 1}/{alts.length}</span>
      <button type="button" class="icon-btn" data-testid="alt-next" aria-label="Next version" disabled={busy || idx >= alts.length - 1} onClick={() => actions.alternative(m.id, 1)}>›</button>
    </span>
  );
}

function MessageViewInner({ m, busy, actions, figures, last = false, paused }: Props) {
  const [editing, setEditing] = useState(false);
  const [draft, setDraft] = useState('');
  const [copied, setCopied] = useState(false);
  const editRef = useRef<HTMLTextAreaElement>(null);
  const el = useRef<HTMLElement>(null);
  const painted = useRef(false);
  // The TTFT a person sees: from pressing send to the first reply text on screen.
  useLayoutEffect(() => {
    if (painted.current || !m.text || m.client_sent_at === undefined) return;
    painted.current = true;
    const sent = m.client_sent_at;
    const mark = () => {
      if (el.current) el.current.dataset.clientTtftMs = String(Math.round(performance.now() - sent));
    };
    if (typeof requestAnimationFrame === 'function') requestAnimationFrame(mark);
    else mark();
  }, [m.text]);
  const streaming = m.status === 'streaming';
  // A paused reply drops the status-streaming class: its blinking cursor would say text is coming.
  const shownStatus = paused ? 'paused' : m.status;
  const confirmed = m.id > 0;

  const copy = async () => {
    if (await copyText(m.text)) {
      setCopied(true);
      setTimeout(() => setCopied(false), 1500);
    }
  };
  const startEdit = () => {
    setDraft(m.text);
    setEditing(true);
    setTimeout(() => editRef.current?.focus(), 0);
  };
  const documents = !!m.attachments?.length;
  const saveEdit = () => {
    if ((draft.trim() || documents) && actions.edit(m.id, draft)) setEditing(false);
  };

  return (
    <article
      ref={el}
      class={`msg msg-${m.role} status-${shownStatus}`}
      data-testid="message"
      data-message-id={String(m.id)}
      data-role={m.role}
      data-status={m.status}
      data-paused={paused ? 'true' : undefined}
    >
      <div class="msg-body">
        {m.attachments?.length ? <MessageAttachments docs={m.attachments} /> : null}
        {m.sources?.length ? <MessageSources sources={m.sources} /> : null}
        {editing ? (
          <div class="edit-box">
            <textarea
              ref={editRef}
              data-testid="edit-input"
              value={draft}
              rows={Math.min(12, Math.max(2, draft.split('\n').length))}
              onInput={(e) => setDraft((e.target as HTMLTextAreaElement).value)}
              onKeyDown={(e) => {
                if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
                  e.preventDefault();
                  saveEdit();
                } else if (e.key === 'Escape') {
                  e.stopPropagation();
                  setEditing(false);
                }
              }}
            />
            <div class="edit-actions">
              <button type="button" class="btn" data-testid="edit-cancel" onClick={() => setEditing(false)}>Cancel</button>
              <button type="button" class="btn primary" data-testid="edit-save" disabled={busy || (!draft.trim() && !documents)} onClick={saveEdit}>Save &amp; send</button>
            </div>
          </div>
        ) : m.role === 'assistant' ? (
          <Markdown text={m.text} streaming={streaming} />
        ) : m.text || !m.attachments?.length ? (
          <div class="plain" data-testid="message-content">{m.text}</div>
        ) : null}
        {streaming && !m.text && !paused ? <span class="typing" aria-label="Writing">●●●</span> : null}
      </div>
      {paused ? <div class="msg-note muted" data-testid="message-paused" role="status">{paused}</div> : null}
      {m.error ? <div class="msg-error" role="alert" data-testid="message-error">{m.error}</div> : null}
      {!streaming && m.role === 'assistant' && m.status !== 'complete' && !m.error ? (
        <div class="msg-note" data-testid="message-note">
          {m.status === 'stopped'
            ? m.finish_reason && m.finish_reason !== 'abort' && FINISH_WORDS[m.finish_reason]
              ? FINISH_WORDS[m.finish_reason]
              : 'Stopped — the reply is kept as far as it got.'
            : FINISH_WORDS[m.finish_reason || ''] || 'The reply ended with an error.'}
        </div>
      ) : m.role === 'assistant' && m.status === 'complete' && m.finish_reason === 'length' ? (
        <div class="msg-note" data-testid="message-note">{FINISH_WORDS.length}</div>
      ) : null}
      {m.status === 'sending' ? <div class="msg-note muted">Sending…</div> : null}
      {!editing ? (
        <div class="msg-foot">
          <Alternatives m={m} busy={busy} actions={actions} />
          {m.role === 'assistant' && m.model ? (
            <span class="msg-model" data-testid="message-model" title="The model that wrote this reply">{m.model}</span>
          ) : null}
          {confirmed && !streaming ? (
            <span class="msg-actions">
              <button type="button" class="icon-btn" data-testid="message-copy" aria-label="Copy message" title="Copy" onClick={copy}>
                {copied ? 'Copied' : 'Copy'}
              </button>
              {m.role === 'user' ? (
                <button type="button" class="icon-btn" data-testid="message-edit" aria-label="Edit and resend" title="Edit" disabled={busy} onClick={startEdit}>Edit</button>
              ) : null}
              {last && m.role === 'assistant' && m.status === 'complete' && m.finish_reason === 'length' ? (
                <button type="button" class="icon-btn" data-testid="message-continue" aria-label="Continue this reply" title="Continue from where the reply was cut off" disabled={busy} onClick={() => actions.continueReply(m.id)}>Continue</button>
              ) : null}
              {m.role === 'assistant' && m.text && canSpeak() ? <ReadAloud m={m} content={el} /> : null}
              {m.role === 'assistant' ? <FeedbackButtons m={m} actions={actions} /> : null}
              {m.role === 'assistant' ? (
                <button type="button" class="icon-btn" data-testid="message-regenerate" aria-label="Regenerate reply" title="Regenerate" disabled={busy} onClick={() => actions.regenerate(m.id)}>Regenerate</button>
              ) : null}
            </span>
          ) : null}
          {figures ? <Figures m={m} paused={paused} /> : null}
        </div>
      ) : null}
    </article>
  );
}

export const MessageView = memo(MessageViewInner, (a, b) => a.m === b.m && a.busy === b.busy && a.actions === b.actions && a.figures === b.figures && a.last === b.last && a.paused === b.paused);
