import { Attachments, type AttachmentsPort } from './attachments';
import type { ConversationsPort } from './conversations';
import { Conversations } from './conversations';
import { SavedPrompts, promptsApi, type PromptsPort } from './prompts';
import { ChatProtocol, type SocketPort } from './protocol';
import { ServerInfo, type ServerInfoPort } from './server-info';
import { UiState } from './ui-state';

/** The page's state, by concern; the views get this object (ui/hooks.ts). */
export interface Chat {
  readonly ui: UiState;
  readonly server: ServerInfo;
  readonly conversations: Conversations;
  readonly protocol: ChatProtocol;
  readonly attachments: Attachments;
  /** The saved prompts (`/` in the composer, the Ctrl+K palette). */
  readonly prompts: SavedPrompts;
}

export type ApiPort = ConversationsPort & ServerInfoPort & AttachmentsPort;

/** `staff`: the signed-in user is staff (the page says so: `#app[data-is-staff]`). */
export function createChat(socket: SocketPort, api: ApiPort, opts: { staff?: boolean; prompts?: PromptsPort } = {}): Chat {
  const ui = new UiState({ staff: opts.staff });
  const server = new ServerInfo(api);
  // A conversation loaded from the server may hold a reply still being written: resume it.
  const conversations = new Conversations(api, ui, () => protocol.resumeStreaming());
  const attachments = new Attachments(api);
  const protocol: ChatProtocol = new ChatProtocol(socket, conversations, ui, server, attachments);
  const prompts = new SavedPrompts(opts.prompts ?? promptsApi);
  return { ui, server, conversations, protocol, attachments, prompts };
}
