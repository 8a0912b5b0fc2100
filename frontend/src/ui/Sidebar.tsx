import { useEffect, useRef, useState } from 'preact/hooks';
import { getCookie } from '../api';
import { dayBucket } from '../format';
import type { Conversation, Organising } from '../types';
import { useChat } from './hooks';
import { PencilIcon, TrashIcon } from './icons';
import { ImportButton } from './ImportButton';

interface Props {
  username: string;
  isStaff: boolean;
  logoutUrl: string;
  theme: 'light' | 'dark';
  onToggleTheme(): void;
  onNavigate(): void;
  /** Opens the account dialog (API keys, shared links). */
  onOpenAccount?(): void;
}

interface ItemProps {
  c: Conversation;
  active: boolean;
  /** The list's one Tab stop (roving tabindex): arrows move it, see Sidebar. */
  tabStop: boolean;
  onFocus(id: number): void;
  onNavigate(): void;
}

/** Pin, a folder, archive: asked in a row under the item (the ⋯ button). */
function Organise({ c, onDone }: { c: Conversation; onDone(): void }) {
  const { conversations } = useChat();
  const [filing, setFiling] = useState(false);
  const [folder, setFolder] = useState(c.folder || '');
  const first = useRef<HTMLButtonElement>(null);
  const input = useRef<HTMLInputElement>(null);
  useEffect(() => (filing ? input.current?.focus() : first.current?.focus()), [filing]);
  const act = async (change: Organising) => {
    onDone();
    await conversations.organise(c.id, change);
  };
  const keys = (e: KeyboardEvent) => {
    if (e.key === 'Escape') {
      e.stopPropagation();
      onDone();
    }
  };
  return (
    <div class="conv-organise" role="group" aria-label={`Organise “${c.title || 'New chat'}”`} data-testid="conversation-organise" onKeyDown={keys}>
      {filing ? (
        <form class="conv-folder-form" onSubmit={(e) => { e.preventDefault(); void act({ folder: folder.trim() }); }}>
          <input ref={input} class="conv-rename" data-testid="conversation-folder-input" aria-label="Folder (empty for none)" placeholder="Folder name, empty for none" value={folder} maxLength={60} onInput={(e) => setFolder((e.target as HTMLInputElement).value)} />
          <button type="submit" class="btn small" data-testid="conversation-folder-save">Move</button>
        </form>
      ) : (
        <>
          <button type="button" class="btn small" ref={first} data-testid="conversation-pin" aria-pressed={!!c.pinned} onClick={() => act({ pinned: !c.pinned })}>{c.pinned ? 'Unpin' : 'Pin'}</button>
          <button type="button" class="btn small" data-testid="conversation-folder" onClick={() => setFiling(true)}>{c.folder ? 'Change folder' : 'Move to folder'}</button>
          <button type="button" class="btn small" data-testid="conversation-archive" onClick={() => act({ archived: !c.archived })}>{c.archived ? 'Unarchive' : 'Archive'}</button>
        </>
      )}
    </div>
  );
}

function Item({ c, active, tabStop, onFocus, onNavigate }: ItemProps) {
  const { conversations } = useChat();
  const [organising, setOrganising] = useState(false);
  const [renaming, setRenaming] = useState(false);
  const [confirming, setConfirming] = useState(false);
  const [title, setTitle] = useState(c.title);
  const input = useRef<HTMLInputElement>(null);
  const openButton = useRef<HTMLButtonElement>(null);
  const cancelButton = useRef<HTMLButtonElement>(null);
  // Focus follows the inline rename and the delete prompt, and comes back to the item after
  const wasBusy = useRef(false);
  useEffect(() => {
    if (renaming) input.current?.select();
    else if (confirming) cancelButton.current?.focus();
    // (only when the focus went with the input or prompt, never away from where the person clicked)
    else if (wasBusy.current && (!document.activeElement || document.activeElement === document.body)) openButton.current?.focus();
    wasBusy.current = renaming || confirming;
  }, [renaming, confirming]);

  // Whether the inline rename is still live: Esc ends it at once, so the blur that the
  // browser fires when the input goes away does not save the cancelled title.
  const live = useRef(false);
  const startRename = () => {
    setTitle(c.title);
    live.current = true;
    setRenaming(true);
  };
  const save = async () => {
    if (!live.current) return;
    live.current = false;
    setRenaming(false);
    if (title.trim() && title.trim() !== c.title) await conversations.rename(c.id, title);
  };

  return (
    <li class={'conv-item' + (active ? ' active' : '')} data-testid="conversation-item" data-conversation-id={String(c.id)} data-active={active ? 'true' : 'false'}>
      {renaming ? (
        <input
          ref={input}
          class="conv-rename"
          data-testid="conversation-rename-input"
          aria-label="Conversation title"
          value={title}
          maxLength={200}
          onInput={(e) => setTitle((e.target as HTMLInputElement).value)}
          onKeyDown={(e) => {
            if (e.key === 'Enter') save();
            else if (e.key === 'Escape') {
              e.stopPropagation();
              live.current = false;
              setRenaming(false);
            }
          }}
          onBlur={save}
        />
      ) : confirming ? (
        <div class="conv-confirm" data-testid="conversation-delete-prompt">
          <span>Delete “{c.title || 'New chat'}”?</span>
          <button type="button" class="btn danger small" data-testid="conversation-delete-confirm" onClick={() => { setConfirming(false); conversations.remove(c.id); }}>Delete</button>
          <button
            type="button"
            class="btn small"
            ref={cancelButton}
            data-testid="conversation-delete-cancel"
            onClick={() => setConfirming(false)}
            onKeyDown={(e) => {
              if (e.key === 'Escape') {
                e.stopPropagation();
                setConfirming(false);
              }
            }}
          >
            Cancel
          </button>
        </div>
      ) : (
        <>
          <button
            type="button"
            class="conv-open"
            ref={openButton}
            data-testid="conversation-open"
            title={c.title}
            tabIndex={tabStop ? 0 : -1}
            aria-current={active ? 'page' : undefined}
            aria-describedby="conv-keys"
            onFocus={() => onFocus(c.id)}
            onClick={() => {
              conversations.select(c.id);
              onNavigate();
            }}
            onDblClick={startRename}
            onKeyDown={(e) => {
              if (e.key === 'ContextMenu' || (e.shiftKey && e.key === 'F10')) {
                e.preventDefault();
                setOrganising(!organising);
              } else if (e.key === 'F2') {
                e.preventDefault();
                startRename();
              } else if (e.key === 'Delete') {
                e.preventDefault();
                setConfirming(true);
              }
            }}
          >
            {c.pinned ? <span class="conv-pin" title="Pinned"><span aria-hidden="true">★ </span><span class="sr-only">Pinned: </span></span> : null}
            {c.title || 'New chat'}
          </button>
          <span class="conv-tools">
            {/* Out of the Tab order (the list is one stop): F2 and Delete do the same from the keyboard. */}
            <button type="button" class="icon-btn" tabIndex={-1} data-testid="conversation-rename" aria-label="Rename" title="Rename (F2)" onClick={startRename}><PencilIcon /></button>
            <button type="button" class="icon-btn" tabIndex={-1} data-testid="conversation-delete" aria-label="Delete" title="Delete (Delete key)" onClick={() => setConfirming(true)}><TrashIcon /></button>
            <button type="button" class="icon-btn" tabIndex={-1} data-testid="conversation-more" aria-label="Pin, folder, archive" aria-expanded={organising} title="Pin, folder, archive (context menu key)" onClick={() => setOrganising(!organising)}>⋯</button>
          </span>
          {organising ? <Organise c={c} onDone={() => setOrganising(false)} /> : null}
        </>
      )}
    </li>
  );
}

/** The list's groups: pinned first, then each folder (by name), then the rest by day. */
export function groupsOf(list: readonly Conversation[]): [string, Conversation[]][] {
  const pinned = list.filter((c) => c.pinned);
  const folders = new Map<string, Conversation[]>();
  const groups: [string, Conversation[]][] = pinned.length ? [['Pinned', pinned]] : [];
  const dated: [string, Conversation[]][] = [];
  for (const c of list) {
    if (c.pinned) continue;
    if (c.folder) {
      folders.set(c.folder, [...(folders.get(c.folder) ?? []), c]);
      continue;
    }
    const b = dayBucket(c.updated_at || c.created_at);
    const g = dated[dated.length - 1];
    if (g && g[0] === b) g[1].push(c);
    else dated.push([b, [c]]);
  }
  const named = [...folders].sort(([a], [b]) => a.localeCompare(b)).map(([name, items]) => [`Folder: ${name}`, items] as [string, Conversation[]]);
  return [...groups, ...named, ...dated];
}

export function Sidebar(props: Props) {
  const { conversations } = useChat();
  const all = conversations.list.value;
  const results = conversations.searchResults.value;
  const currentId = conversations.currentId.value;
  const listLoaded = conversations.listLoaded.value;
  const [q, setQ] = useState('');
  const [focusId, setFocusId] = useState<number | null>(null);
  const timer = useRef<ReturnType<typeof setTimeout>>();

  const onSearch = (v: string) => {
    setQ(v);
    clearTimeout(timer.current);
    timer.current = setTimeout(() => conversations.search(v), 200);
  };

  const list = results ?? all;
  const has = (id: number | null) => id != null && list.some((c) => c.id === id);
  const tabStop = has(focusId) ? focusId : has(currentId) ? currentId : (list[0]?.id ?? null);

  // Arrows, Home and End move between conversations; Enter opens (the button's own click).
  const onListKey = (e: KeyboardEvent) => {
    const target = e.target as HTMLElement;
    if (target.dataset.testid !== 'conversation-open') return;
    const buttons = [...(e.currentTarget as HTMLElement).querySelectorAll<HTMLButtonElement>('[data-testid="conversation-open"]')];
    const i = buttons.indexOf(target as HTMLButtonElement);
    const to = { ArrowDown: i + 1, ArrowUp: i - 1, Home: 0, End: buttons.length - 1 }[e.key];
    if (to === undefined) return;
    e.preventDefault();
    buttons[Math.max(0, Math.min(buttons.length - 1, to))]?.focus();
  };
  const groups = results ? [['Results', [...list]] as [string, Conversation[]]] : groupsOf(list);
  const archived = conversations.archived.value;
  const [showArchived, setShowArchived] = useState(false);

  return (
    <aside class="sidebar" data-testid="sidebar" aria-label="Conversations">
      <div class="sidebar-top">
        <button
          type="button"
          class="btn primary new-chat"
          data-testid="new-chat"
          title="New chat (Ctrl+Shift+O)"
          onClick={() => {
            conversations.newChat();
            props.onNavigate();
          }}
        >
          + New chat
        </button>
        <ImportButton onNavigate={props.onNavigate} />
      </div>
      <div class="search">
        <input
          type="search"
          data-testid="conversation-search"
          placeholder="Search conversations"
          aria-label="Search conversations"
          value={q}
          onInput={(e) => onSearch((e.target as HTMLInputElement).value)}
        />
      </div>
      <nav class="conv-list" data-testid="conversation-list" aria-label="Conversation list" onKeyDown={onListKey}>
        <span id="conv-keys" class="sr-only">Arrow keys move between conversations, Enter opens, F2 renames, Delete deletes.</span>
        {groups.map(([label, items]) => (
          <section key={label}>
            <h3 class="conv-group">{label}</h3>
            <ul>
              {items.map((c) => (
                <Item key={c.id} c={c} active={c.id === currentId} tabStop={c.id === tabStop} onFocus={setFocusId} onNavigate={props.onNavigate} />
              ))}
            </ul>
          </section>
        ))}
        {listLoaded && list.length === 0 ? (
          <p class="conv-empty" data-testid="conversation-empty">{results ? 'No conversation matches.' : 'No conversations yet.'}</p>
        ) : null}
        {showArchived && !results ? (
          <section data-testid="archived-list">
            <h3 class="conv-group">Archived</h3>
            {archived?.length === 0 ? <p class="conv-empty">Nothing archived.</p> : null}
            <ul>
              {(archived ?? []).map((c) => (
                <Item key={c.id} c={c} active={c.id === currentId} tabStop={c.id === tabStop} onFocus={setFocusId} onNavigate={props.onNavigate} />
              ))}
            </ul>
          </section>
        ) : null}
      </nav>
      {!results && listLoaded ? (
          <button
            type="button"
            class="icon-btn show-archived"
            data-testid="show-archived"
            aria-expanded={showArchived}
            onClick={() => {
              if (!showArchived) void conversations.loadArchived();
              setShowArchived(!showArchived);
            }}
          >
            {showArchived ? 'Hide archived' : 'Archived chats'}
          </button>
        ) : null}
      <div class="sidebar-foot">
        <span class="user" data-testid="username" title={props.username}>{props.username}</span>
        {props.onOpenAccount ? (
          <button type="button" class="icon-btn" data-testid="account-button" aria-haspopup="dialog" title="Instructions, saved prompts, exports, API keys and shared links" onClick={props.onOpenAccount}>Account</button>
        ) : null}
        {props.isStaff ? <a class="icon-btn" href="/admin/" data-testid="admin-link">Admin</a> : null}
        <button
          type="button"
          class="icon-btn"
          data-testid="theme-toggle"
          data-theme={props.theme}
          aria-label={props.theme === 'dark' ? 'Switch to light theme' : 'Switch to dark theme'}
          title={props.theme === 'dark' ? 'Light theme' : 'Dark theme'}
          onClick={props.onToggleTheme}
        >
          {props.theme === 'dark' ? '☀' : '☾'}
        </button>
        <form
          method="post"
          action={props.logoutUrl}
          class="logout"
          onSubmit={(e) => {
            const f = e.currentTarget as HTMLFormElement;
            (f.elements.namedItem('csrfmiddlewaretoken') as HTMLInputElement).value = getCookie('csrftoken');
          }}
        >
          <input type="hidden" name="csrfmiddlewaretoken" value={getCookie('csrftoken')} />
          <button type="submit" class="icon-btn" data-testid="logout-button">Log out</button>
        </form>
      </div>
    </aside>
  );
}
