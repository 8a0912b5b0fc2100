import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import type { Chat } from '../chat';
import type { ThreadKey } from '../ui-state';
import { cleanSettings } from '../protocol';
import { stopState } from '../paused';
import { matching, slashQuery, type SavedPrompt } from '../prompts';
import { DraftChips, PaperclipIcon, PromptCount } from './Attachments';
import { useChat } from './hooks';

const MAX_HEIGHT = 220;
// Past this many characters the words alone may fill much of the window: count them too.
const COUNT_FROM_CHARS = 2000;
const ACCEPT = '.txt,.md,.markdown,.csv,.tsv,.json,.jsonl,.yaml,.yml,.toml,.xml,.html,.log,.py,.js,.ts,.tsx,.jsx,.java,.c,.h,.cpp,.cs,.go,.rs,.rb,.php,.sh,.sql,.pdf,text/*,application/json,application/pdf';
// Close code 4503: the server answers but cannot run the chat now (docs/websocket.md).
const UNAVAILABLE = 'The server cannot run the chat right now (a service it needs is down): retrying. Messages can be sent once it is back.';

/** Files a drag or a paste carries (none for plain text). */
export function filesOf(data: DataTransfer | null): File[] {
  return data ? Array.from(data.files || []) : [];
}

/** Whether a drag carries files (their names are not known until the drop). */
export function carriesFiles(data: DataTransfer | null): boolean {
  return !!data && Array.from(data.types).includes('Files');
}

export interface ComposerProps {
  /** Files are being dragged over the chat (App takes the drop anywhere in it). */
  dragging: boolean;
}

/** Attach files to a thread's next message, as many as one message may carry. */
export function attachFiles({ attachments, server }: Chat, key: ThreadKey, files: File[]): void {
  if (files.length) attachments.add(key, files, server.limits.value?.attachments?.per_message ?? Infinity);
}

export function Composer({ dragging }: ComposerProps) {
  const chat = useChat();
  const { conversations, protocol, ui, attachments, server } = chat;
  const key = conversations.currentKey.value;
  const currentId = conversations.currentId.value;
  const draftRestored = ui.draftRestored.value;
  const conn = ui.conn.value;
  const streaming = conversations.streamingIn(key);
  const busy = conversations.isBusy(key);
  const drafts = attachments.draftsFor(key);
  const measure = attachments.measureFor(key);
  const [text, setText] = useState(() => ui.getDraft(key));
  const ta = useRef<HTMLTextAreaElement>(null);
  const picker = useRef<HTMLInputElement>(null);
  const ready = drafts.filter((d) => d.status === 'ready');
  // `/name` at the start of the box offers the saved prompts (chat.prompts).
  const slash = slashQuery(text);
  const [menuIndex, setMenuIndex] = useState(0);
  const [menuClosed, setMenuClosed] = useState(false);
  const saved = chat.prompts.list.value;
  const options = slash != null && !menuClosed ? matching(saved, slash).slice(0, 8) : [];
  useEffect(() => {
    if (slash == null) setMenuClosed(false);
    else chat.prompts.load().catch(() => undefined);
    setMenuIndex(0);
  }, [slash]);
  const usePrompt = (p: SavedPrompt) => {
    setText(p.text);
    ui.setDraft(key, p.text);
    const el = ta.current;
    if (el) {
      el.focus();
      setTimeout(() => el.setSelectionRange(p.text.length, p.text.length), 0);
    }
  };
  const uploading = drafts.some((d) => d.status === 'uploading');

  useEffect(() => {
    setText(ui.getDraft(key));
    // Not from a dialog opened meanwhile (the palette right after a conversation opened).
    if (!document.activeElement?.closest('[role="dialog"]')) ta.current?.focus();
  }, [key, draftRestored]);

  useLayoutEffect(() => {
    const el = ta.current;
    if (!el) return;
    el.style.height = 'auto';
    el.style.height = Math.min(MAX_HEIGHT, el.scrollHeight) + 'px';
  }, [text]);

  // Count the prompt against the window while there are documents or many words.
  const readyIds = ready.map((d) => d.info?.id).join(',');
  // Counted for the model the send would go to: the picker's.
  const model = conversations.modelOf(currentId, server.defaultModel.value);
  useEffect(() => {
    const wanted = ready.length > 0 || text.length >= COUNT_FROM_CHARS;
    const settings = currentId == null ? cleanSettings(conversations.draftSettings.value) : undefined;
    const body = { conversation_id: currentId, text: text.trim(), ...(settings ? { settings } : {}), ...(model ? { model } : {}) };
    attachments.measure(key, body, wanted);
  }, [key, text, readyIds, model]);

  const tooLong = !!measure?.size && !measure.size.fits;
  const send = () => {
    if ((!text.trim() && !ready.length) || uploading || tooLong) return;
    const r = protocol.sendMessage(text, attachments.ready(key));
    if (r.ok) {
      attachments.take(key);
      setText('');
    }
  };
  const attach = (files: File[]) => attachFiles(chat, key, files);
  const tokens = new Map((measure?.size?.attachments ?? []).map((a) => [a.id, a.tokens] as [number, number | null]));

  const online = conn === 'open';
  const stop = stopState(conn);
  // Why Send is off while the socket is down; the same words as the line above the box.
  const offlineReason =
    conn === 'unauthorized' ? 'You are signed out.' : conn === 'connecting' ? 'Connecting…' : conn === 'unavailable' ? UNAVAILABLE : 'You are offline: messages can be sent again once the connection is back.';
  return (
    <form
      class={'composer' + (dragging ? ' dragging' : '')}
      data-testid="composer"
      data-dragging={dragging ? 'true' : 'false'}
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
    >
      {!online ? (
        <div class="composer-offline" id="composer-offline" data-testid="composer-offline" role="status">
          {conn === 'unauthorized' ? (
            <span>You are signed out. <a href="/accounts/login/">Sign in again</a>.</span>
          ) : conn === 'connecting' ? (
            'Connecting…'
          ) : conn === 'unavailable' ? (
            UNAVAILABLE
          ) : (
            'Connection lost — reconnecting… Messages cannot be sent until it is back.'
          )}
        </div>
      ) : null}
      <DraftChips drafts={drafts} tokens={tokens} onRemove={(k) => attachments.remove(key, k)} />
      {options.length ? (
        <ul class="prompt-menu" id="prompt-menu" role="listbox" aria-label="Saved prompts" data-testid="prompt-menu">
          {options.map((p, i) => (
            <li
              key={p.id}
              id={'prompt-option-' + i}
              role="option"
              aria-selected={i === menuIndex}
              class={'prompt-option' + (i === menuIndex ? ' active' : '')}
              data-testid="prompt-option"
              onMouseDown={(e) => {
                e.preventDefault(); // the box keeps the focus
                usePrompt(p);
              }}
            >
              <code>/{p.name}</code> <span class="muted">{p.text.slice(0, 90)}</span>
            </li>
          ))}
        </ul>
      ) : slash != null && !menuClosed && chat.prompts.list.value.length === 0 ? (
        <div class="prompt-menu muted" data-testid="prompt-menu-empty">No saved prompts yet: add them under Your account (or keep typing to send “/…” as it is).</div>
      ) : null}
      <PromptCount m={measure} />
      <div class="composer-box">
        <button
          type="button"
          class="icon-btn attach"
          data-testid="attach-button"
          aria-label="Attach files"
          title="Attach text, code, CSV, JSON or PDF files (or drop them here, or paste them)"
          onClick={() => picker.current?.click()}
        >
          <PaperclipIcon />
        </button>
        <input
          ref={picker}
          type="file"
          multiple
          accept={ACCEPT}
          hidden
          data-testid="attach-input"
          onChange={(e) => {
            const input = e.target as HTMLInputElement;
            attach(Array.from(input.files || []));
            input.value = '';
          }}
        />
        <textarea
          ref={ta}
          id="composer-input"
          data-testid="composer-input"
          aria-label="Message"
          placeholder={drafts.length ? 'Ask about the files, or send them as they are' : 'Message'}
          rows={1}
          value={text}
          onInput={(e) => {
            const v = (e.target as HTMLTextAreaElement).value;
            setText(v);
            ui.setDraft(key, v);
          }}
          onPaste={(e) => {
            const files = filesOf(e.clipboardData);
            if (!files.length) return;
            e.preventDefault();
            attach(files);
          }}
          aria-controls={options.length ? 'prompt-menu' : undefined}
          aria-activedescendant={options.length ? 'prompt-option-' + menuIndex : undefined}
          aria-autocomplete={slash != null ? 'list' : undefined}
          onKeyDown={(e) => {
            if (options.length) {
              if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
                e.preventDefault();
                const d = e.key === 'ArrowDown' ? 1 : -1;
                setMenuIndex((i) => (i + d + options.length) % options.length);
                return;
              }
              if ((e.key === 'Enter' && !e.shiftKey) || e.key === 'Tab') {
                e.preventDefault();
                usePrompt(options[Math.min(menuIndex, options.length - 1)]);
                return;
              }
              if (e.key === 'Escape') {
                e.preventDefault();
                e.stopPropagation();
                setMenuClosed(true);
                return;
              }
            }
            if (e.key === 'Enter' && !e.shiftKey && !e.isComposing && (e as KeyboardEvent).keyCode !== 229) {
              e.preventDefault();
              send();
            }
          }}
        />
        {streaming ? (
          <button
            type="button"
            class="btn stop"
            data-testid="stop-button"
            aria-label="Stop generating"
            title={stop.reason}
            disabled={!stop.enabled}
            onClick={() => protocol.stop()}
          >
            <span class="stop-square" aria-hidden="true" /> Stop
          </button>
        ) : (
          <button
            type="submit"
            class="btn primary send"
            data-testid="send-button"
            aria-label="Send message"
            data-online={online ? 'true' : 'false'}
            title={online ? (tooLong ? measure?.size?.message ?? undefined : uploading ? 'Waiting for the files to be read' : undefined) : offlineReason}
            aria-describedby={online ? undefined : 'composer-offline'}
            disabled={!online || (!text.trim() && !ready.length) || busy || uploading || tooLong}
          >
            Send
          </button>
        )}
      </div>
      <div class="composer-hint">Enter to send · Shift+Enter for a new line · Esc stops · / saved prompts · Ctrl+K search and commands · ? shortcuts · drop or paste files to attach them</div>
    </form>
  );
}
