import { useEffect, useRef, useState } from 'preact/hooks';
import { exportUrl } from '../api';
import { applyTheme, effectiveTheme, setTheme, watchSystemTheme, type Theme } from '../theme';
import { AccountDialog } from './AccountDialog';
import { attachFiles, carriesFiles, Composer, filesOf } from './Composer';
import { useChat } from './hooks';
import { MessageList } from './MessageList';
import { ComparePicker, ModelPicker } from './ModelPicker';
import { SettingsDialog } from './SettingsDialog';
import { ShareDialog } from './ShareDialog';
import { Sidebar } from './Sidebar';
import { Palette, ShortcutsDialog, type Command } from './Palette';
import { stopSpeech } from '../speech';

export interface AppProps {
  username: string;
  isStaff: boolean;
  logoutUrl: string;
}

const CONN_WORDS: Record<string, string> = {
  open: 'Connected',
  connecting: 'Connecting…',
  reconnecting: 'Reconnecting…',
  unavailable: 'Server unavailable',
  unauthorized: 'Signed out',
  closed: 'Offline',
};

export function App(props: AppProps) {
  const chat = useChat();
  const { conversations, protocol, ui } = chat;
  const currentId = conversations.currentId.value;
  const temporary = conversations.isTemporary(currentId);
  const title = temporary ? 'Temporary chat' : conversations.conversation(currentId)?.title;
  const jsonMode = (currentId != null ? conversations.conversation(currentId)?.settings : conversations.draftSettings.value)?.json_mode === true;
  const conn = ui.conn.value;
  const toasts = ui.toasts.value;
  const announcement = ui.announcement.value;
  const [theme, setThemeState] = useState<Theme>(() => effectiveTheme());
  const [settingsOpen, setSettingsOpen] = useState(false);
  const [shareOpen, setShareOpen] = useState(false);
  const [accountOpen, setAccountOpen] = useState(false);
  const [drawer, setDrawer] = useState(false);
  const [dragging, setDragging] = useState(false);
  const [paletteOpen, setPaletteOpen] = useState(false);
  const [shortcutsOpen, setShortcutsOpen] = useState(false);
  // The key listener is added once and reads these, so a key pressed between a render and
  // the next effect never acts on the state before it (an Escape that stopped a reply
  // instead of closing the dialog that had just opened).
  const open = useRef({ settingsOpen, drawer });
  open.current = { settingsOpen, drawer };

  useEffect(() => {
    applyTheme();
    return watchSystemTheme(setThemeState);
  }, []);

  useEffect(() => {
    setShareOpen(false);
    stopSpeech();
  }, [currentId]);

  useEffect(() => {
    document.title = title ? `${title} · Chat` : 'Chat';
  }, [title]);

  useEffect(() => {
    const onKey = (e: KeyboardEvent) => {
      const mod = e.ctrlKey || e.metaKey;
      if (mod && e.shiftKey && (e.key === 'o' || e.key === 'O' || e.code === 'KeyO')) {
        e.preventDefault();
        conversations.newChat();
        setDrawer(false);
        return;
      }
      if (mod && !e.shiftKey && !e.altKey && (e.key === 'k' || e.key === 'K' || e.code === 'KeyK')) {
        e.preventDefault();
        setShortcutsOpen(false);
        setPaletteOpen((was) => !was);
        return;
      }
      // `?` shows the shortcuts, except where it is being typed.
      if (e.key === '?' && !mod && !e.altKey && !typing(e.target)) {
        e.preventDefault();
        setShortcutsOpen(true);
        return;
      }
      if (e.key === 'Escape' && !e.defaultPrevented) {
        if (open.current.settingsOpen) setSettingsOpen(false);
        else if (open.current.drawer) setDrawer(false);
        else protocol.stop();
      }
    };
    window.addEventListener('keydown', onKey);
    // A file dropped outside the chat (the sidebar, a dialog) is not opened by the browser
    // in place of the page, which would leave the conversation.
    const keepPage = (e: DragEvent) => {
      if (carriesFiles(e.dataTransfer) && !e.defaultPrevented) e.preventDefault();
    };
    window.addEventListener('dragover', keepPage);
    window.addEventListener('drop', keepPage);
    return () => {
      window.removeEventListener('keydown', onKey);
      window.removeEventListener('dragover', keepPage);
      window.removeEventListener('drop', keepPage);
    };
  }, []);

  const toggleTheme = () => setThemeState(setTheme(theme === 'dark' ? 'light' : 'dark'));
  const paletteActions: Command[] = [
    { id: 'new-chat', label: 'New chat', group: 'Actions', run: () => conversations.newChat(false) },
    { id: 'new-temporary-chat', label: 'New temporary chat', hint: 'not saved, gone when the tab closes', group: 'Actions', run: () => conversations.newChat(true) },
    { id: 'export-all', label: 'Export all conversations', group: 'Actions', run: () => setAccountOpen(true) },
    { id: 'saved-prompts', label: 'Manage saved prompts', group: 'Actions', run: () => setAccountOpen(true) },
    { id: 'settings', label: 'Conversation settings', group: 'Actions', run: () => setSettingsOpen(true) },
    { id: 'theme', label: theme === 'dark' ? 'Light theme' : 'Dark theme', group: 'Actions', run: toggleTheme },
    { id: 'shortcuts', label: 'Keyboard shortcuts', group: 'Actions', run: () => setShortcutsOpen(true) },
  ];
  const insertPrompt = (text: string) => {
    ui.setDraft(conversations.currentKey.value, text, true);
  };

  return (
    <div class={'app' + (drawer ? ' drawer-open' : '')} data-testid="app">
      <a
        class="skip-link"
        href="#composer-input"
        data-testid="skip-to-composer"
        onClick={(e) => {
          // Focus only: following the href would replace the #/c/<id> that names the conversation.
          e.preventDefault();
          document.getElementById('composer-input')?.focus();
        }}
      >
        Skip to the message box
      </a>
      <Sidebar
        username={props.username}
        isStaff={props.isStaff}
        logoutUrl={props.logoutUrl}
        theme={theme}
        onToggleTheme={toggleTheme}
        onNavigate={() => setDrawer(false)}
        onOpenAccount={() => setAccountOpen(true)}
      />
      <div class="scrim" data-testid="drawer-scrim" onClick={() => setDrawer(false)} />
      <main
        class={'chat' + (dragging ? ' dragging' : '')}
        onDragOver={(e) => {
          if (!carriesFiles(e.dataTransfer)) return;
          e.preventDefault();
          e.dataTransfer!.dropEffect = 'copy';
          setDragging(true);
        }}
        onDragLeave={(e) => {
          if (!(e.currentTarget as HTMLElement).contains(e.relatedTarget as Node | null)) setDragging(false);
        }}
        onDrop={(e) => {
          setDragging(false);
          const files = filesOf(e.dataTransfer);
          if (!files.length) return;
          e.preventDefault();
          attachFiles(chat, conversations.currentKey.value, files);
        }}
      >
        <header class="chat-head">
          <button type="button" class="icon-btn menu" data-testid="sidebar-toggle" aria-label="Show conversations" aria-expanded={drawer} onClick={() => setDrawer(!drawer)}>☰</button>
          <h1 class="chat-title" data-testid="conversation-title" title={title || 'New chat'}>{title || 'New chat'}</h1>
          <span class={'conn conn-' + conn} data-testid="connection-status" data-state={conn} title={CONN_WORDS[conn]}>
            <span class="dot" aria-hidden="true" />
            <span class="conn-text">{CONN_WORDS[conn]}</span>
          </span>
          {/* On a phone these wrap onto a second row of the header (styles.css), so each
              stays whole and a finger's width. */}
          <div class="head-tools">
            <ModelPicker />
            <ComparePicker />
            {currentId == null ? (
              <button
                type="button"
                class={'icon-btn temporary-toggle' + (temporary ? ' on' : '')}
                data-testid="temporary-toggle"
                aria-pressed={temporary}
                title={temporary ? 'This new chat is temporary: press to make it a saved one' : 'Make this new chat temporary: not saved in your history'}
                onClick={() => conversations.setTemporaryMode(!temporary)}
              >
                Temporary
              </button>
            ) : null}
            {currentId != null && !temporary ? (
              <span class="exports">
                <a class="icon-btn" data-testid="export-md" href={exportUrl(currentId, 'md')} download title="Export as Markdown">MD</a>
                <a class="icon-btn" data-testid="export-json" href={exportUrl(currentId, 'json')} download title="Export as JSON">JSON</a>
                <a class="icon-btn" data-testid="export-txt" href={exportUrl(currentId, 'txt')} download title="Export as plain text">TXT</a>
              </span>
            ) : null}
            {currentId != null && !temporary ? (
              <button type="button" class="icon-btn" data-testid="share-button" aria-haspopup="dialog" title="Share a read-only link" onClick={() => setShareOpen(true)}>Share</button>
            ) : null}
          </div>
          {jsonMode ? (
            <button type="button" class="icon-btn json-mode-on" data-testid="json-mode-on" title="Every reply in this chat is a JSON object: press to change it in the settings" onClick={() => setSettingsOpen(true)}>
              JSON mode
            </button>
          ) : null}
          <button type="button" class="icon-btn settings-btn" data-testid="settings-button" aria-label="Conversation settings" title="Settings" onClick={() => setSettingsOpen(true)}>⚙</button>
        </header>
        {temporary ? (
          <div class="temporary-banner" role="note" data-testid="temporary-banner">
            <strong>Temporary chat.</strong> Not saved in your history, not searchable, not shareable, and gone when you close or reload this tab or open another chat.
          </div>
        ) : null}
        <MessageList />
        <Composer dragging={dragging} />
        {dragging ? (
          <div class="drop-zone" data-testid="drop-zone" aria-hidden="true">
            <span>Drop files to attach them to your next message</span>
          </div>
        ) : null}
      </main>
      {settingsOpen ? <SettingsDialog key={String(currentId)} onClose={() => setSettingsOpen(false)} /> : null}
      {shareOpen && currentId != null ? <ShareDialog conversationId={currentId} username={props.username} onClose={() => setShareOpen(false)} /> : null}
      {paletteOpen ? <Palette onClose={() => setPaletteOpen(false)} actions={paletteActions} onInsert={insertPrompt} /> : null}
      {shortcutsOpen ? <ShortcutsDialog onClose={() => setShortcutsOpen(false)} /> : null}
      {accountOpen ? <AccountDialog prompts={chat.prompts} onClose={() => setAccountOpen(false)} onOpenConversation={(id) => conversations.select(id)} onInstructionsSaved={() => void chat.server.loadLimits()} /> : null}
      {/* Always in the page (a live region added with its text is not read); the same words
          twice differ by a trailing space, so a second identical reply is read too. */}
      <div class="sr-only" role="status" aria-live="polite" aria-atomic="true" data-testid="reply-announcer">
        {announcement ? announcement.text + (announcement.id % 2 ? '' : '\u00a0') : ''}
      </div>
      <div class="toasts" aria-live="polite">
        {toasts.map((t) => (
          <div class="toast" role="alert" data-testid="toast" key={t.id}>
            <span>{t.text}</span>
            <button type="button" class="icon-btn" aria-label="Dismiss" onClick={() => ui.dismiss(t.id)}>×</button>
          </div>
        ))}
      </div>
    </div>
  );
}

/** Whether a key goes into a text field (where `?` is a character, not a shortcut). */
function typing(target: EventTarget | null): boolean {
  const el = target as HTMLElement | null;
  if (!el || !el.tagName) return false;
  return el.isContentEditable || ['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName);
}
