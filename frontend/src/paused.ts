import type { Message } from './types';
import type { ConnState } from './ws';

/**
 * What a reply being written looks like while the socket is not open. The server keeps
 * writing it for CHAT_DISCONNECT_GRACE_S (docs/websocket.md), but this page receives
 * nothing until it reconnects and sends `resume`: a blinking cursor and a live Stop
 * button would claim otherwise.
 */

/** The reply is still being written as far as this page knows, but no frame can reach it. */
export function isPaused(m: Pick<Message, 'status'> | undefined, conn: ConnState): boolean {
  return !!m && m.status === 'streaming' && conn !== 'open';
}

/** The words shown in place of the cursor of a paused reply. */
export function pausedWords(conn: ConnState): string {
  if (conn === 'unauthorized') return 'Signed out — sign in again to see the rest of this reply.';
  if (conn === 'unavailable') return 'The server cannot run the chat right now — the reply will continue once it is back.';
  return 'Reconnecting… the reply will continue.';
}

/**
 * Whether Stop can be pressed, and why not. A stop sent while offline would wait in the
 * queue and reach the server after the reply may have finished, so the button says why it
 * is off instead; once the connection is back the reply resumes and Stop works again.
 */
export function stopState(conn: ConnState): { enabled: boolean; reason?: string } {
  if (conn === 'open') return { enabled: true };
  if (conn === 'unauthorized') return { enabled: false, reason: 'You are signed out: the reply cannot be stopped from this page.' };
  return { enabled: false, reason: 'The connection is lost: Stop works again once it is back and the reply has resumed.' };
}
