import { render } from 'preact';
import { api } from './api';
import { createChat, type Chat } from './chat';
import { followInHash, parseHash } from './nav';
import { applyTheme } from './theme';
import { ChatSocket, wsUrl } from './ws';
import { App } from './ui/App';
import { ChatContext } from './ui/hooks';
import './styles.css';

export function boot(root: HTMLElement): Chat & { socket: ChatSocket } {
  applyTheme();
  const ds = root.dataset;
  const socket = new ChatSocket({
    url: wsUrl(),
    onFrame: (f) => chat.protocol.handleFrame(f),
    onState: (s) => chat.protocol.setConn(s),
    onOpen: (reconnected) => chat.protocol.onOpen(reconnected),
  });
  const isStaff = ds.isStaff === 'true';
  const chat = createChat(socket, api, { staff: isStaff });
  const { conversations, server, ui } = chat;

  render(
    <ChatContext.Provider value={chat}>
      <App username={ds.username || ''} isStaff={isStaff} logoutUrl={ds.logoutUrl || '/accounts/logout/'} />
    </ChatContext.Provider>,
    root,
  );

  socket.start();
  conversations.refreshList().catch((e) => ui.notify(null, e.message || 'Could not load your conversations.'));
  server.loadEngine();
  server.loadLimits();
  server.loadModels();
  const start = parseHash();
  if (start != null) conversations.select(start);
  followInHash(conversations);

  window.addEventListener('hashchange', () => {
    const id = parseHash();
    if (id != null && id !== conversations.currentId.value) conversations.select(id);
  });
  window.addEventListener('online', () => socket.reconnectNow());
  window.addEventListener('offline', () => socket.goneOffline());
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') socket.reconnectNow();
  });
  return { ...chat, socket };
}

const root = document.getElementById('app');
if (root) (window as unknown as { __chat: Chat }).__chat = boot(root);
