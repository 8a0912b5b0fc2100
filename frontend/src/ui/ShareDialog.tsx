import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { ConversationLink, sharingApi, type SharingPort } from '../sharing';
import { copyText } from './clipboard';
import { useModal, when } from './modal';
import './account.css';

interface Props {
  conversationId: number;
  username: string;
  onClose(): void;
  /** For tests: the server's sharing endpoints by default. */
  api?: SharingPort;
}

/** Share the conversation on screen: a read-only link to a copy of it as it is now. */
export function ShareDialog({ conversationId, username, onClose, api = sharingApi }: Props) {
  const state = useMemo(() => new ConversationLink(api, conversationId), [api, conversationId]);
  const link = state.link.value;
  const busy = state.busy.value;
  const error = state.error.value;
  const [author, setAuthor] = useState(false);
  const [settings, setSettings] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [copied, setCopied] = useState('');
  const [said, setSaid] = useState('');
  const modal = useModal(onClose);
  const keepButton = useRef<HTMLButtonElement>(null);

  useEffect(() => {
    void state.load();
  }, [state]);
  useEffect(() => {
    if (link) {
      setAuthor(link.show_author);
      setSettings(link.show_settings);
    }
  }, [link?.url]);
  useEffect(() => {
    if (confirming) keepButton.current?.focus();
  }, [confirming]);

  const publish = async () => {
    const wasShared = !!link;
    if (await state.publish({ show_author: author, show_settings: settings })) {
      setSaid(wasShared ? 'The link now shows the conversation as it is now.' : 'Link created. Anyone who has it can read this copy.');
    }
  };
  const revoke = async () => {
    if (await state.revoke()) {
      setConfirming(false);
      setSaid('Sharing stopped: the link no longer works.');
      modal.ref.current?.focus();
    }
  };
  const copy = async () => {
    if (link) setCopied((await copyText(link.url)) ? 'Link copied.' : 'Could not copy: select the link and copy it.');
  };

  const options = (
    <fieldset class="share-options">
      <legend>What the link shows besides the messages</legend>
      <label class="check">
        <input type="checkbox" data-testid="share-show-author" checked={author} disabled={busy} onChange={(e) => setAuthor((e.target as HTMLInputElement).checked)} />
        <span>My username ({username})</span>
      </label>
      <label class="check">
        <input type="checkbox" data-testid="share-show-settings" checked={settings} disabled={busy} onChange={(e) => setSettings((e.target as HTMLInputElement).checked)} />
        <span>The system prompt and settings</span>
      </label>
    </fieldset>
  );

  return (
    <div class="overlay" onMouseDown={(e) => e.target === e.currentTarget && onClose()}>
      <div class="dialog share-dialog" role="dialog" aria-modal="true" aria-labelledby="share-title" data-testid="share-dialog" tabIndex={-1} {...modal}>
        <h2 id="share-title">Share this conversation</h2>
        {link === undefined ? (
          <p class="muted" data-testid="share-loading">Loading…</p>
        ) : link === null ? (
          <>
            <p>
              Anyone with the link can read a copy of this conversation as it is now: the messages on screen (not their other
              versions), without logging in. Messages you send later are not shown until you update the link. Reply figures are
              never shown.
            </p>
            {options}
          </>
        ) : (
          <>
            <label>
              Link
              <span class="share-url-row">
                <input type="text" readOnly value={link.url} data-testid="share-url" onFocus={(e) => (e.target as HTMLInputElement).select()} />
                <button type="button" class="btn" data-testid="share-copy" onClick={copy}>Copy link</button>
              </span>
            </label>
            <p class="muted small" data-testid="share-info">
              A copy of {link.message_count} message{link.message_count === 1 ? '' : 's'}, taken {when(link.shared_at)}.{' '}
              <a href={link.url} target="_blank" rel="noopener noreferrer">Open it</a>
            </p>
            {link.changed ? (
              <p class="notice share-changed" data-testid="share-changed">
                <span>The conversation changed since: update the link to show it as it is now.</span>
              </p>
            ) : null}
            {options}
          </>
        )}
        <p class="sr-only" role="status" data-testid="share-status">{copied || said}</p>
        {copied ? <p class="muted small" aria-hidden="true">{copied}</p> : null}
        {error ? <p class="form-error" role="alert" data-testid="share-error">{error}</p> : null}
        {confirming ? (
          <div class="confirm-box" role="group" aria-labelledby="share-revoke-question" data-testid="share-revoke-prompt">
            <p id="share-revoke-question">Stop sharing? The link stops working for everyone who has it; sharing again makes a new link.</p>
            <div class="dialog-actions">
              <span class="spacer" />
              <button type="button" class="btn" data-testid="share-revoke-cancel" ref={keepButton} onClick={() => setConfirming(false)}>Keep sharing</button>
              <button type="button" class="btn danger" data-testid="share-revoke-confirm" disabled={busy} onClick={revoke}>Stop sharing</button>
            </div>
          </div>
        ) : (
          <div class="dialog-actions">
            {link ? (
              <button type="button" class="btn danger-outline" data-testid="share-revoke" disabled={busy} onClick={() => setConfirming(true)}>Stop sharing</button>
            ) : null}
            <span class="spacer" />
            <button type="button" class="btn" data-testid="share-close" onClick={onClose}>Close</button>
            {link !== undefined ? (
              <button type="button" class="btn primary" data-testid="share-create" disabled={busy} onClick={publish}>
                {link ? 'Update link' : 'Create link'}
              </button>
            ) : null}
          </div>
        )}
      </div>
    </div>
  );
}
