/** Error codes from docs/websocket.md, in words a person understands. */
const WORDS: Record<string, string> = {
  busy: 'The server is busy right now. Please try again in a moment.',
  too_long: 'This conversation no longer fits in what the model can read. Start a new chat, or edit an earlier message to make it shorter.',
  engine_unavailable: 'The model is not running right now. Please try again in a little while.',
  engine_error: 'The model failed while writing this reply. What it wrote so far has been kept.',
  already_streaming: 'A reply is still being written in this conversation. Wait for it to finish or stop it first.',
  not_found: 'That conversation or message does not exist any more.',
  frame_too_large: 'That message is too long to send.',
  bad_frame: 'The app sent something the server did not understand. Reloading the page may help.',
  offline: 'You are offline, so the message was not sent. It is still in the box — send it again once the connection is back.',
  unauthorized: 'You are signed out. Please sign in again.',
  model_not_found: 'That model is not served here any more. Pick another model at the top of the chat and send again.',
};

export function errorWords(code: string | undefined, serverMessage?: string): string {
  // The server's own words where they carry the particulars: the model and what is served
  // instead, the count of a prompt over the window.
  if ((code === 'invalid' || code === 'model_not_found' || code === 'too_long') && serverMessage) return serverMessage;
  if (code && WORDS[code]) return WORDS[code];
  return serverMessage || 'Something went wrong. Please try again.';
}
