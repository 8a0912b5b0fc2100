import { render } from 'preact';
import { act } from 'preact/test-utils';
import { createChat, type Chat } from '../src/chat';
import { followInHash } from '../src/nav';
import { App, type AppProps } from '../src/ui/App';
import { ChatContext } from '../src/ui/hooks';
import { ChatSocket } from '../src/ws';
import { FakeApi, FakeSocket } from './fakes';

export interface Mounted extends Chat {
  root: HTMLElement;
  socket: ChatSocket;
  stop(): void;
}

/** The whole app over a FakeSocket and `api`, rendered into a fresh element, its socket started. */
export async function mountApp(
  api: FakeApi,
  /** `staff` (default true: reply figures on, as for staff) */
  opts: { hash?: boolean; staff?: boolean; props?: Partial<AppProps> } = {},
): Promise<Mounted> {
  const staff = opts.staff ?? true;
  FakeSocket.all = [];
  const socket: ChatSocket = new ChatSocket({
    url: 'ws://test/ws/chat/',
    factory: (u) => new FakeSocket(u),
    onFrame: (f) => chat.protocol.handleFrame(f),
    onState: (s) => chat.protocol.setConn(s),
    onOpen: (r) => chat.protocol.onOpen(r),
    pingIntervalMs: 0,
  });
  const chat = createChat(socket, api, { staff });
  const unfollow = opts.hash ? followInHash(chat.conversations) : () => undefined;
  const root = document.createElement('div');
  document.body.appendChild(root);
  await act(() => {
    render(
      <ChatContext.Provider value={chat}>
        <App username="alice" isStaff={staff} logoutUrl="/accounts/logout/" {...opts.props} />
      </ChatContext.Provider>,
      root,
    );
  });
  await act(() => socket.start());
  const stop = () => {
    unfollow();
    render(null, root);
    root.remove();
    socket.close();
  };
  return { ...chat, root, socket, stop };
}
