import type { ChatLimits } from './limits';
import type { AttachmentInfo, Conversation, EngineInfo, Feedback, Message, ModelsInfo, Organising, PromptSize, Rating, Settings } from './types';

export function getCookie(name: string, cookie = typeof document !== 'undefined' ? document.cookie : ''): string {
  for (const part of cookie.split(';')) {
    const [k, ...v] = part.trim().split('=');
    if (k === name) return decodeURIComponent(v.join('='));
  }
  return '';
}

export class ApiError extends Error {
  constructor(public status: number, public code: string, message: string) {
    super(message);
  }
}

/** One JSON request with the session cookie and, for a write, the CSRF header. A failure
 * is an ApiError whose message a person can read (the server's own words when it sent some). */
export async function request<T>(method: string, path: string, body?: unknown): Promise<T> {
  // A file or a form goes as it is (the browser sets its type); anything else as JSON.
  const raw = typeof Blob !== 'undefined' && (body instanceof Blob || body instanceof FormData);
  const headers: Record<string, string> = { Accept: 'application/json' };
  if (body !== undefined && !raw) headers['Content-Type'] = 'application/json';
  if (raw && body instanceof Blob) headers['Content-Type'] = body.type || 'application/octet-stream';
  if (method !== 'GET' && method !== 'HEAD') headers['X-CSRFToken'] = getCookie('csrftoken');
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : raw ? (body as BodyInit) : JSON.stringify(body),
    });
  } catch {
    throw new ApiError(0, 'network', 'Could not reach the server. Check your connection.');
  }
  if (res.status === 204) return undefined as T;
  let data: any = null;
  try {
    data = await res.json();
  } catch {
    /* not JSON */
  }
  if (!res.ok) {
    // {"error": {"code", "message"}} (docs/http.md), or {"error": "words"} from the dashboard's views.
    const e = data && data.error;
    const code: string | undefined = typeof e === 'object' && e ? e.code : undefined;
    const words: string | undefined = typeof e === 'string' ? e : e?.message;
    if (res.status === 401 || res.status === 403) {
      throw new ApiError(res.status, code || 'unauthorized', words || 'You are signed out. Please sign in again.');
    }
    throw new ApiError(res.status, code || 'http_' + res.status, words || `The server answered ${res.status}.`);
  }
  return data as T;
}

export const api = {
  me: () => request<{ username: string; is_staff: boolean }>('GET', '/api/me/'),
  list: (q = '') =>
    request<{ conversations: Conversation[] }>('GET', '/api/conversations/' + (q ? '?q=' + encodeURIComponent(q) : '')),
  listArchived: () => request<{ conversations: Conversation[] }>('GET', '/api/conversations/?archived=1'),
  create: (body: { title?: string; settings?: Settings }) => request<Conversation>('POST', '/api/conversations/', body),
  get: (id: number, before?: number) =>
    request<{ conversation: Conversation; messages: Message[]; older?: boolean }>(
      'GET',
      `/api/conversations/${id}/${before == null ? '' : `?before=${before}`}`,
    ),
  patch: (id: number, body: { title?: string; settings?: Settings; active_message?: number; model?: string } & Organising) =>
    request<Conversation | { conversation: Conversation; messages: Message[] }>('PATCH', `/api/conversations/${id}/`, body),
  remove: (id: number) => request<void>('DELETE', `/api/conversations/${id}/`),
  engine: () => request<EngineInfo>('GET', '/api/engine/'),
  limits: () => request<ChatLimits>('GET', '/api/chat/limits/'),
  models: () => request<ModelsInfo>('GET', '/api/models/'),
  uploadAttachment: (file: File) => {
    const form = new FormData();
    form.append('file', file, file.name);
    return request<AttachmentInfo>('POST', '/api/attachments/', form);
  },
  attachment: (id: number) => request<AttachmentInfo & { text: string }>('GET', `/api/attachments/${id}/`),
  removeAttachment: (id: number) => request<void>('DELETE', `/api/attachments/${id}/`),
  promptSize: (body: { conversation_id: number | null; text: string; attachments: number[]; settings?: Settings; model?: string }) =>
    request<PromptSize>('POST', '/api/chat/prompt-size/', body),
  feedback: (messageId: number, body: { rating: Rating | null; comment?: string }) =>
    request<{ message_id: number; feedback: Feedback | null }>('PUT', `/api/messages/${messageId}/feedback/`, body),
  importConversations: (file: File) =>
    request<{ imported: number; conversations: Conversation[] }>('POST', '/api/conversations/import/', file),
};

export const exportUrl = (id: number, kind: 'md' | 'json' | 'txt') => `/api/conversations/${id}/export.${kind}`;
