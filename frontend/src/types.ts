// Shapes from docs/websocket.md and docs/http.md.

export interface Settings {
  system_prompt?: string;
  temperature?: number;
  top_p?: number;
  max_tokens?: number;
  /** Replies held to a JSON object while decoding (the API's response_format json_object). */
  json_mode?: boolean;
}

export interface Conversation {
  id: number;
  title: string;
  created_at: string;
  updated_at: string;
  settings?: Settings | null;
  /** The model the conversation's turns go to (the header's picker). */
  model?: string;
  /** Organising (the sidebar): pinned first, archived out of the list, a folder's group. */
  pinned?: boolean;
  archived?: boolean;
  folder?: string;
  /** Kept only while the page that started it is open; never listed or shared. */
  temporary?: boolean;
}

export type Rating = 'up' | 'down';

/** The owner's feedback on a reply (docs/http.md, "Feedback"). */
export interface Feedback {
  rating: Rating;
  comment: string;
  at?: string | null;
}

export type Organising = { pinned?: boolean; archived?: boolean; folder?: string };

export interface Figures {
  ttft_ms?: number | null;
  output_tokens?: number | null;
  tokens_per_s?: number | null;
  prompt_tokens?: number | null;
  /** Prompt tokens reused from the KV cache, both tiers (memory and Redis). */
  cached_tokens?: number | null;
  /** The part of cached_tokens restored from the Redis KV tier. */
  cached_tokens_redis?: number | null;
  e2e_ms?: number | null;
  queue_ms?: number | null;
  /** True when the reply was replayed from the server's response cache. */
  replayed?: boolean;
}

/** A document attached to a user message (docs/http.md, "Attachments"); `text` only where asked for. */
export interface AttachmentInfo {
  id: number;
  name: string;
  kind: 'text' | 'pdf';
  /** Bytes of the file as uploaded. */
  size: number;
  /** Tokens of its block in the prompt; null where the server cannot tell (an upstream engine). */
  tokens: number | null;
  message_id: number | null;
  text?: string;
}

/** POST /api/chat/prompt-size/: what a send would put before the model. */
export interface PromptSize {
  prompt_tokens: number | null;
  context_tokens: number | null;
  fits: boolean;
  /** Why it does not fit, in the words a send past the window is refused with. */
  message: string | null;
  attachments: { id: number; tokens: number | null }[];
  /** The documents do not fit whole: how many of their passages would go instead. */
  passages?: number;
}

/** A passage of a document too long to read whole, sent in its place (a user message's `sources`). */
export interface Source {
  n: number;
  attachment_id: number;
  name: string;
  page: number | null;
  text: string;
}

export type Role = 'user' | 'assistant' | 'system';
/** Server statuses plus two client-only ones for an optimistic user message. */
export type Status = 'complete' | 'streaming' | 'stopped' | 'error' | 'sending' | 'failed';

export interface Message {
  /** Server id; a negative number for a message the server has not confirmed yet. */
  id: number;
  conversation_id: number | null;
  role: Role;
  text: string;
  status: Status;
  finish_reason?: string | null;
  parent_id?: number | null;
  created_at?: string;
  figures?: Figures | null;
  alternatives?: number[];
  alternative_index?: number;
  /** Generation sequence number (the server adds it to snapshots and deltas; optional). */
  seq?: number;
  /** client-only */
  client_id?: string;
  /** client-only: performance.now() when the person pressed send (for the TTFT they see). */
  client_sent_at?: number;
  error?: string;
  /** A user message's documents (without their text). */
  attachments?: AttachmentInfo[];
  /** Passages sent in place of documents too long to read whole. */
  sources?: Source[];
  /** The model that wrote a reply (or that a user turn went to); null on older messages. */
  model?: string | null;
  /** The owner's feedback on a reply, where given. */
  feedback?: Feedback | null;
}

/** GET /api/models/: the models a conversation can use, the default first. */
export interface ModelsInfo {
  default: string;
  models: {
    id: string;
    default: boolean;
    context_tokens: number | null;
    /** What the model's files hold, where the server can read them (docs/models.md). */
    architecture?: string | null;
    weight_format?: string | null;
  }[];
}

export interface EngineInfo {
  model: string;
  max_model_len: number;
  speculative_modes: string[];
  defaults: { temperature: number; top_p: number; max_tokens: number };
  /** CHAT_MAX_MESSAGE_CHARS: the longest message the server takes (docs/http.md). */
  max_message_chars?: number;
}

export type ServerFrame =
  | { type: 'conversation'; conversation: Conversation }
  | { type: 'start'; conversation_id: number; client_id?: string; user_message?: Message | null; message: Message; compare_to?: number }
  | { type: 'delta'; message_id: number; text: string; seq?: number }
  | { type: 'snapshot'; message: Message }
  | { type: 'done'; message_id: number; status: 'complete' | 'stopped' | 'error'; finish_reason?: string; figures?: Figures; message?: Message }
  | { type: 'title'; conversation_id: number; title: string }
  | { type: 'error'; code: string; message: string; conversation_id?: number; message_id?: number; client_id?: string }
  | { type: 'pong' };

export type ClientFrame =
  | { type: 'send'; conversation_id: number | null; text: string; client_id?: string; settings?: Settings; model?: string; attachments?: number[]; temporary?: boolean; compare_model?: string }
  | { type: 'stop'; message_id: number }
  | { type: 'regenerate'; message_id: number; model?: string }
  | { type: 'edit'; message_id: number; text: string; model?: string; attachments?: number[] }
  | { type: 'resume'; message_id: number }
  | { type: 'continue'; message_id: number }
  | { type: 'ping' };
