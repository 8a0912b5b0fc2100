/**
 * The script of the server-rendered pages (dist/pages.js): the theme the chat uses (the
 * system's while none was chosen), copy buttons (`button[data-copy=<id of the element
 * whose text to copy>]`, hidden until this script shows them), and, on a shared
 * conversation's page, its replies rendered as the chat renders them (the renderer loads
 * only there).
 */
import { applyTheme, watchSystemTheme } from '../theme';
import { copyText } from '../ui/clipboard';
import './pages.css';

export function wireCopyButtons(root: ParentNode): void {
  for (const btn of Array.from(root.querySelectorAll<HTMLButtonElement>('button[data-copy]'))) {
    btn.hidden = false;
    btn.addEventListener('click', async () => {
      const source = document.getElementById(btn.dataset.copy || '');
      if (!source) return;
      const ok = await copyText(source.textContent || '');
      btn.textContent = ok ? 'Copied' : 'Copy failed: select the text and copy it';
      setTimeout(() => (btn.textContent = 'Copy'), 2000);
    });
  }
}

applyTheme();
watchSystemTheme(() => undefined);
wireCopyButtons(document);
if (document.querySelector('[data-markdown]')) {
  void import('./shared').then((m) => m.renderShared(document));
}
