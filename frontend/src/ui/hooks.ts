import { createContext } from 'preact';
import { useContext } from 'preact/hooks';
import type { Chat } from '../chat';

/** The page's state (chat.ts). Views read its signals' `.value` in render, which
 * subscribes them (@preact/signals): no manual change notifications. */
export const ChatContext = createContext<Chat>(null as unknown as Chat);

export function useChat(): Chat {
  return useContext(ChatContext);
}
