import { useEffect, useMemo, useRef, useState } from 'preact/hooks';
import { ApiKeys, KEY_NAME_MAX_CHARS, keysApi, type ApiKeyInfo, type KeysPort } from '../api-keys';
import { SharedLinks, sharingApi, type SharedLink, type SharingPort } from '../sharing';
import { copyText } from './clipboard';
import type { SavedPrompts } from '../prompts';
import { InstructionsSection } from './InstructionsSection';
import { ExportSection, PromptsSection } from './LibrarySections';
import { useModal, when } from './modal';
import './account.css';

interface Props {
  onClose(): void;
  /** Opens a shared conversation in the chat. */
  onOpenConversation?(id: number): void;
  /** The custom instructions were saved (new chats' default system prompt changed). */
  onInstructionsSaved?(): void;
  /** The saved prompts, managed here. */
  prompts?: SavedPrompts;
  /** For tests: the server's endpoints by default. */
  keys?: KeysPort;
  sharing?: SharingPort;
}

/** The account's custom instructions, API keys and shared links, managed from the chat. */
export function AccountDialog({ onClose, onOpenConversation, onInstructionsSaved, prompts, keys = keysApi, sharing = sharingApi }: Props) {
  const keyState = useMemo(() => new ApiKeys(keys), [keys]);
  const linkState = useMemo(() => new SharedLinks(sharing), [sharing]);
  const close = () => {
    // Closing forgets a new key's secret: it was shown once.
    keyState.forget();
    onClose();
  };
  const modal = useModal(close);
  useEffect(() => {
    void keyState.load();
    void linkState.load();
  }, [keyState, linkState]);
  const [status, setStatus] = useState('');

  return (
    <div class="overlay" onMouseDown={(e) => e.target === e.currentTarget && close()}>
      <div class="dialog account-dialog" role="dialog" aria-modal="true" aria-labelledby="account-title" data-testid="account-dialog" tabIndex={-1} {...modal}>
        <h2 id="account-title">Your account</h2>
        <InstructionsSection say={setStatus} onSaved={onInstructionsSaved} />
        {prompts ? <PromptsSection prompts={prompts} say={setStatus} /> : null}
        <ExportSection say={setStatus} />
        <KeysSection state={keyState} say={setStatus} />
        <LinksSection state={linkState} say={setStatus} onOpenConversation={onOpenConversation} onClose={close} />
        <p class="sr-only" role="status" data-testid="account-status">{status}</p>
        <div class="dialog-actions">
          <span class="spacer" />
          <button type="button" class="btn" data-testid="account-close" onClick={close}>Close</button>
        </div>
      </div>
    </div>
  );
}

/** "Revoke?" asked in place, with the safe answer focused. */
function Confirm({ question, yes, onYes, onNo, testid }: { question: string; yes: string; onYes(): void; onNo(): void; testid: string }) {
  const no = useRef<HTMLButtonElement>(null);
  useEffect(() => no.current?.focus(), []);
  return (
    <span class="confirm-inline" role="group" aria-label={question} data-testid={`${testid}-prompt`}>
      <span>{question}</span>
      <button type="button" class="btn small" ref={no} data-testid={`${testid}-cancel`} onClick={onNo}>Cancel</button>
      <button type="button" class="btn small danger" data-testid={`${testid}-confirm`} onClick={onYes}>{yes}</button>
    </span>
  );
}

function KeysSection({ state, say }: { state: ApiKeys; say(words: string): void }) {
  const list = state.list.value;
  const max = state.maxKeys.value;
  const created = state.created.value;
  const error = state.error.value;
  const busy = state.busy.value;
  const [name, setName] = useState('');
  const [confirming, setConfirming] = useState<number | null>(null);
  const [copied, setCopied] = useState(false);
  const secretBox = useRef<HTMLDivElement>(null);
  const nameInput = useRef<HTMLInputElement>(null);

  useEffect(() => {
    if (created) secretBox.current?.focus();
    setCopied(false);
  }, [created?.key.id]);

  const create = async (e: Event) => {
    e.preventDefault();
    if (await state.create(name)) {
      setName('');
      say('Key created. Copy it now: it is shown only once.');
    } else nameInput.current?.focus();
  };
  const copy = async () => {
    if (!created) return;
    const ok = await copyText(created.secret);
    setCopied(ok);
    say(ok ? 'Key copied.' : 'Could not copy: select the key and copy it.');
  };
  const revoke = async (k: ApiKeyInfo) => {
    setConfirming(null);
    if (await state.revoke(k.id)) say(`Key “${k.name}” revoked.`);
    nameInput.current?.focus();
  };

  return (
    <section class="account-section" aria-labelledby="keys-title" data-testid="keys-section">
      <h3 id="keys-title">API keys</h3>
      <p class="muted small">
        For any OpenAI client: base URL <code>{window.location.origin}/v1</code>. A key is shown once, when it is made.
      </p>
      {created ? (
        <div class="new-secret" tabIndex={-1} ref={secretBox} data-testid="new-key" aria-labelledby="new-key-words">
          <p id="new-key-words">
            <strong>Your new key “{created.key.name}”: copy it now, it is shown only once.</strong>
          </p>
          <div class="share-url-row">
            <code class="secret" data-testid="new-key-value">{created.secret}</code>
            <button type="button" class="btn" data-testid="new-key-copy" onClick={copy}>{copied ? 'Copied' : 'Copy'}</button>
            <button type="button" class="btn" data-testid="new-key-done" onClick={() => { state.forget(); nameInput.current?.focus(); }}>Done</button>
          </div>
        </div>
      ) : null}
      <form class="key-form" onSubmit={create} noValidate>
        <label>
          Name of a new key
          <input
            ref={nameInput}
            type="text"
            data-testid="key-name"
            value={name}
            maxLength={KEY_NAME_MAX_CHARS}
            placeholder="e.g. laptop script"
            aria-invalid={error ? 'true' : undefined}
            aria-describedby={error ? 'key-error' : undefined}
            onInput={(e) => setName((e.target as HTMLInputElement).value)}
          />
        </label>
        <button type="submit" class="btn primary" data-testid="key-create" disabled={busy}>Create key</button>
      </form>
      {error ? <p class="form-error" id="key-error" role="alert" data-testid="key-error">{error}</p> : null}
      {list === null ? (
        <p class="muted small">Loading…</p>
      ) : list.length === 0 ? (
        <p class="muted small" data-testid="keys-empty">No keys yet.</p>
      ) : (
        <div class="table-wrap">
          <table class="account-table" data-testid="keys-table">
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Key</th>
                <th scope="col">Created</th>
                <th scope="col">Last used</th>
                <th scope="col"><span class="sr-only">Actions</span></th>
              </tr>
            </thead>
            <tbody>
              {list.map((k) => (
                <tr key={k.id} data-testid="key-row" data-key-id={String(k.id)}>
                  <td class="name">{k.name}</td>
                  <td><code>{k.prefix}…</code></td>
                  <td>{when(k.created_at)}</td>
                  <td data-testid="key-last-used">{k.last_used_at ? when(k.last_used_at) : 'never'}</td>
                  <td class="actions">
                    {confirming === k.id ? (
                      <Confirm question={`Revoke “${k.name}”? Programs using it stop working.`} yes="Revoke" testid="key-revoke" onYes={() => revoke(k)} onNo={() => setConfirming(null)} />
                    ) : (
                      <button type="button" class="btn small" data-testid="key-revoke" aria-label={`Revoke ${k.name}`} onClick={() => setConfirming(k.id)}>Revoke</button>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      {list && max ? (
        <p class="muted small" data-testid="keys-count">
          {list.length} of at most {max} keys. Also on the <a href="/settings/keys/">API keys page</a>.
        </p>
      ) : null}
    </section>
  );
}

function LinksSection({ state, say, onOpenConversation, onClose }: { state: SharedLinks; say(words: string): void; onOpenConversation?(id: number): void; onClose(): void }) {
  const list = state.list.value;
  const error = state.error.value;
  const [confirming, setConfirming] = useState<number | null>(null);
  const heading = useRef<HTMLHeadingElement>(null);

  const copy = async (s: SharedLink) => say((await copyText(s.url)) ? 'Link copied.' : 'Could not copy the link.');
  const revoke = async (s: SharedLink) => {
    setConfirming(null);
    if (await state.revoke(s.conversation_id)) say(`Stopped sharing “${s.title || 'Untitled'}”.`);
    heading.current?.focus();
  };

  return (
    <section class="account-section" aria-labelledby="links-title" data-testid="links-section">
      <h3 id="links-title" tabIndex={-1} ref={heading}>Shared links</h3>
      <p class="muted small">Read-only copies of conversations, for anyone who has the link. Share one from its header (Share).</p>
      {error ? <p class="form-error" role="alert" data-testid="links-error">{error}</p> : null}
      {list === null ? (
        <p class="muted small">Loading…</p>
      ) : list.length === 0 ? (
        <p class="muted small" data-testid="links-empty">You have not shared any conversation.</p>
      ) : (
        <ul class="link-list">
          {list.map((s) => (
            <li key={s.conversation_id} data-testid="link-row" data-conversation-id={String(s.conversation_id)}>
              <div class="link-main">
                <a href={s.url} target="_blank" rel="noopener noreferrer" data-testid="link-open">{s.title || 'Untitled'}</a>
                <span class="muted small">
                  {s.message_count} message{s.message_count === 1 ? '' : 's'}, taken {when(s.shared_at)}
                </span>
              </div>
              <div class="link-actions">
                {confirming === s.conversation_id ? (
                  <Confirm question="Stop sharing? The link stops working." yes="Stop sharing" testid="link-revoke" onYes={() => revoke(s)} onNo={() => setConfirming(null)} />
                ) : (
                  <>
                    {onOpenConversation ? (
                      <button type="button" class="btn small" data-testid="link-conversation" onClick={() => { onClose(); onOpenConversation(s.conversation_id); }}>Open chat</button>
                    ) : null}
                    <button type="button" class="btn small" data-testid="link-copy" onClick={() => copy(s)}>Copy link</button>
                    <button type="button" class="btn small" data-testid="link-revoke" aria-label={`Stop sharing ${s.title || 'Untitled'}`} onClick={() => setConfirming(s.conversation_id)}>Stop sharing</button>
                  </>
                )}
              </div>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}
