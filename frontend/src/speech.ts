import { signal, type ReadonlySignal } from '@preact/signals';

/** The reply being read aloud (its message id), or null. */
const _speaking = signal<number | null>(null);
export const speaking: ReadonlySignal<number | null> = _speaking;

/** Whether this browser can read aloud (the Web Speech API's speechSynthesis). */
export function canSpeak(): boolean {
  return typeof window !== 'undefined' && 'speechSynthesis' in window && typeof SpeechSynthesisUtterance === 'function';
}

/**
 * The words of a reply as they should be heard: its rendered text (markdown marks gone),
 * with each code block said to be one instead of being spelled out symbol by symbol.
 */
export function speakableText(rendered: HTMLElement): string {
  const copy = rendered.cloneNode(true) as HTMLElement;
  copy.querySelectorAll('.code-block, pre').forEach((block) => block.replaceWith(document.createTextNode(' (code block) ')));
  copy.querySelectorAll('button').forEach((b) => b.remove());
  copy.querySelectorAll('.katex-mathml').forEach((el) => el.remove());
  return (copy.textContent || '').replace(/\s+/g, ' ').trim();
}

/** Read a reply aloud (in the browser: nothing goes to the server); reading another, or the same again, stops the one being read. */
export function toggleSpeech(messageId: number, text: string): void {
  if (!canSpeak()) return;
  const synth = window.speechSynthesis;
  const was = _speaking.value;
  synth.cancel();
  _speaking.value = null;
  if (was === messageId || !text) return;
  const u = new SpeechSynthesisUtterance(text);
  u.lang = document.documentElement.lang || navigator.language || 'en';
  const done = () => {
    if (_speaking.value === messageId) _speaking.value = null;
  };
  u.onend = done;
  u.onerror = done;
  _speaking.value = messageId;
  synth.speak(u);
}

/** Stop reading (leaving the conversation, closing the page). */
export function stopSpeech(): void {
  if (!canSpeak()) return;
  window.speechSynthesis.cancel();
  _speaking.value = null;
}
