import { renderMarkdown } from '../markdown';
import { applyMathStyles } from '../math';
import { copyText } from '../ui/clipboard';

/**
 * A shared conversation's page: each `[data-markdown]` element holds a reply's text, as
 * the server escaped it (readable as it is without JavaScript); it becomes the same
 * sanitised markdown the chat shows (code, math, tables, the same DOMPurify rules).
 */
export function renderShared(root: Document | HTMLElement): void {
  for (const el of Array.from(root.querySelectorAll<HTMLElement>('[data-markdown]'))) {
    el.innerHTML = renderMarkdown(el.textContent || '');
    applyMathStyles(el);
    el.dataset.rendered = 'true';
  }
  for (const time of Array.from(root.querySelectorAll<HTMLTimeElement>('time[datetime]'))) {
    const at = new Date(time.dateTime);
    if (!Number.isNaN(at.getTime())) time.textContent = at.toLocaleString(undefined, { dateStyle: 'long', timeStyle: 'short' });
  }
  root.addEventListener('click', async (e) => {
    const btn = (e.target as HTMLElement).closest?.('.copy-code') as HTMLButtonElement | null;
    const code = btn?.closest('.code-block')?.querySelector('code');
    if (btn && code && (await copyText(code.textContent || ''))) {
      btn.textContent = 'Copied';
      setTimeout(() => (btn.textContent = 'Copy'), 1500);
    }
  });
  root.querySelector('[data-testid=shared-page]')?.setAttribute('data-ready', 'true');
}
