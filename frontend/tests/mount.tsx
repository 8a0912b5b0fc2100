import { render } from 'preact';
import { act } from 'preact/test-utils';
import { Store } from '../src/store';
import { App } from '../src/ui/App';
import { StoreContext } from '../src/ui/hooks';
import { ChatSocket } from '../src/ws';
import { FakeApi, FakeSocket } from './fakes';

export interface Mounted {
  root: HTMLElement;
  store: Store;
  socket: ChatSocket;
}

/** The whole app over a FakeSocket and `api`, rendered into a fresh element, its socket started. */
export async function mountApp(api: FakeApi, onNavigate?: Store['onNavigate']): Promise<Mounted> {
  FakeSocket.all = [];
  const socket: ChatSocket = new ChatSocket({
    url: 'ws://test/ws/chat/',
    factory: (u) => new FakeSocket(u),
    onFrame: (f) => store.handleFrame(f),
    onState: (s) => store.setConn(s),
    onOpen: (r) => store.onOpen(r),
    pingIntervalMs: 0,
  });
  const store = new Store(socket, api, (fn) => fn());
  if (onNavigate) store.onNavigate = onNavigate;
  const root = document.createElement('div');
  document.body.appendChild(root);
  await act(() => {
    render(
      <StoreContext.Provider value={store}>
        <App username="alice" isStaff={false} logoutUrl="/accounts/logout/" />
      </StoreContext.Provider>,
      root,
    );
  });
  await act(() => socket.start());
  return { root, store, socket };
}

export function unmountApp(m: Mounted): void {
  render(null, m.root);
  m.root.remove();
  m.socket.close();
}
