import { render } from 'preact';
import { api } from './api';
import { parseHash, syncHash } from './nav';
import { Store } from './store';
import { applyTheme } from './theme';
import { ChatSocket, wsUrl } from './ws';
import { App } from './ui/App';
import { StoreContext } from './ui/hooks';
import './styles.css';


export function boot(root: HTMLElement): { store: Store; socket: ChatSocket } {
  applyTheme();
  const ds = root.dataset;
  let store!: Store;
  const socket = new ChatSocket({
    url: wsUrl(),
    onFrame: (f) => store.handleFrame(f),
    onState: (s) => store.setConn(s),
    onOpen: (reconnected) => store.onOpen(reconnected),
  });
  store = new Store(socket, api);
  store.onNavigate = syncHash;

  render(
    <StoreContext.Provider value={store}>
      <App username={ds.username || ''} isStaff={ds.isStaff === 'true'} logoutUrl={ds.logoutUrl || '/accounts/logout/'} />
    </StoreContext.Provider>,
    root,
  );

  socket.start();
  store.refreshList().catch((e) => store.notify(null, e.message || 'Could not load your conversations.'));
  store.loadEngine();
  store.loadLimits();
  const start = parseHash();
  if (start != null) store.selectConversation(start);

  window.addEventListener('hashchange', () => {
    const id = parseHash();
    if (id != null && id !== store.currentId) store.selectConversation(id);
  });
  window.addEventListener('online', () => socket.reconnectNow());
  window.addEventListener('offline', () => socket.goneOffline());
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') socket.reconnectNow();
  });
  return { store, socket };
}

const root = document.getElementById('app');
if (root) (window as any).__chat = boot(root);
