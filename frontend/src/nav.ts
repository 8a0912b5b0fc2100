import { effect } from '@preact/signals';
import type { Conversations } from './conversations';

/** The current conversation lives in the URL hash (#/c/7) so a refresh returns to it. */
export function parseHash(hash = location.hash): number | null {
  const m = /^#\/c\/(\d+)$/.exec(hash);
  return m ? Number(m[1]) : null;
}

export function syncHash(id: number | null): void {
  const h = id == null ? '' : `#/c/${id}`;
  if (location.hash !== h) history.replaceState(null, '', h || location.pathname + location.search);
}

/** Keep the hash on the current conversation from now on; returns the way to stop. */
export function followInHash(conversations: Conversations): () => void {
  // A temporary chat is not named in the URL: after a reload it is gone.
  return effect(() => {
    const id = conversations.currentId.value;
    syncHash(id != null && conversations.isTemporary(id) ? null : id);
  });
}
