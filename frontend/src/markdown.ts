import { Marked, type Tokens } from 'marked';
import DOMPurify from 'dompurify';
import hljs from 'highlight.js/lib/core';
import bash from 'highlight.js/lib/languages/bash';
import c from 'highlight.js/lib/languages/c';
import cpp from 'highlight.js/lib/languages/cpp';
import css from 'highlight.js/lib/languages/css';
import diff from 'highlight.js/lib/languages/diff';
import go from 'highlight.js/lib/languages/go';
import java from 'highlight.js/lib/languages/java';
import javascript from 'highlight.js/lib/languages/javascript';
import json from 'highlight.js/lib/languages/json';
import markdown from 'highlight.js/lib/languages/markdown';
import plaintext from 'highlight.js/lib/languages/plaintext';
import python from 'highlight.js/lib/languages/python';
import rust from 'highlight.js/lib/languages/rust';
import shell from 'highlight.js/lib/languages/shell';
import sql from 'highlight.js/lib/languages/sql';
import typescript from 'highlight.js/lib/languages/typescript';
import xml from 'highlight.js/lib/languages/xml';
import yaml from 'highlight.js/lib/languages/yaml';
import { fillMath, mathExtension } from './math';

const langs: Record<string, any> = {
  bash, c, cpp, css, diff, go, java, javascript, json, markdown, plaintext, python, rust, shell, sql, typescript, xml, yaml,
};
for (const [name, def] of Object.entries(langs)) hljs.registerLanguage(name, def);
hljs.registerAliases(['sh', 'zsh', 'console'], { languageName: 'bash' });
hljs.registerAliases(['js', 'jsx', 'mjs'], { languageName: 'javascript' });
hljs.registerAliases(['ts', 'tsx'], { languageName: 'typescript' });
hljs.registerAliases(['py', 'python3'], { languageName: 'python' });
hljs.registerAliases(['html', 'svg'], { languageName: 'xml' });
hljs.registerAliases(['yml'], { languageName: 'yaml' });
hljs.registerAliases(['text', 'txt'], { languageName: 'plaintext' });

export function escapeHtml(s: string): string {
  return s.replace(/[&<>"']/g, (ch) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[ch]!);
}

/** Highlight code; unknown languages and very long blocks are only escaped. */
export function highlight(code: string, lang: string | undefined): string {
  const l = (lang || '').trim().split(/\s+/)[0].toLowerCase();
  if (code.length > 100_000) return escapeHtml(code);
  try {
    if (l && hljs.getLanguage(l)) return hljs.highlight(code, { language: l, ignoreIllegals: true }).value;
  } catch {
    /* fall through */
  }
  return escapeHtml(code);
}

/**
 * A tool call or its result from an imported conversation (chatapp/chat/tool_blocks.py
 * writes them as ```tool-call NAME fences): a collapsed block that says which tool, its
 * arguments or output inside, highlighted as JSON when they are JSON.
 */
function toolBlock(kind: 'tool-call' | 'tool-result', name: string, body: string): string {
  let lang = name === 'python' ? 'python' : 'plaintext';
  try {
    JSON.parse(body);
    lang = 'json';
  } catch {
    /* not JSON */
  }
  const what = kind === 'tool-call' ? 'Called tool' : 'Result from';
  return (
    `<details class="tool-block" data-testid="${kind}"><summary>${what} <code>${escapeHtml(name)}</code></summary>` +
    `<pre><code class="hljs language-${lang}">${highlight(body, lang)}</code></pre></details>\n`
  );
}

/** The formulas of the reply being rendered (renderMarkdown is synchronous: one at a time). */
const mathSlots: { tex: string; display: boolean }[] = [];
const md = new Marked({ gfm: true, breaks: false });
md.use(mathExtension(mathSlots));
md.use({
  renderer: {
    code({ text, lang }: Tokens.Code): string {
      const l = (lang || '').trim().split(/\s+/)[0];
      if (l === 'tool-call' || l === 'tool-result') return toolBlock(l, (lang || '').trim().split(/\s+/)[1] || 'tool', text);
      const label = l ? escapeHtml(l) : 'code';
      const cls = l ? ` class="hljs language-${escapeHtml(l.toLowerCase())}"` : ' class="hljs"';
      return (
        `<div class="code-block"><div class="code-head"><span class="code-lang">${label}</span>` +
        `<button type="button" class="copy-code" data-testid="copy-code" aria-label="Copy code">Copy</button></div>` +
        `<pre><code${cls}>${highlight(text, l)}</code></pre></div>\n`
      );
    },
  },
});

let hooked = false;
function purifier() {
  if (!hooked) {
    hooked = true;
    DOMPurify.addHook('afterSanitizeAttributes', (node: Element) => {
      if (node.tagName === 'A' && node.hasAttribute('href')) {
        node.setAttribute('target', '_blank');
        node.setAttribute('rel', 'noopener noreferrer nofollow');
      }
    });
  }
  return DOMPurify;
}

const PURIFY_CONFIG = {
  // HTML only: no SVG or MathML (an SVG <image> loads a URL of its own).
  USE_PROFILES: { html: true },
  // Media and their sources load URLs on sight; none is useful in a chat reply.
  // (An <input> stays only as a task list's checkbox: see taskCheckboxes.)
  FORBID_TAGS: ['style', 'form', 'textarea', 'select', 'iframe', 'object', 'embed', 'video', 'audio', 'source', 'picture', 'track'],
  FORBID_ATTR: ['style', 'srcset', 'poster', 'background', 'ping'],
  ALLOWED_URI_REGEXP: /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i,
};

/** No image in a reply loads: an image sends a request on sight (to another host, with
 * whatever a model wrote into its URL; or to this one, as a GET the reader never chose),
 * and one without a text alternative says nothing to a screen reader. Each becomes its
 * text alternative, a link to open where it points, or plain text for an inline data:
 * image (a browser opens no data: link). */
function imagesAsLinks(root: DocumentFragment): void {
  for (const img of Array.from(root.querySelectorAll('img'))) {
    const src = (img.getAttribute('src') || '').trim();
    const alt = (img.getAttribute('alt') || '').trim();
    const words = `[image${alt ? `: ${alt}` : ''}]`;
    if (!src && !alt) {
      img.remove();
      continue;
    }
    if (!src || /^data:/i.test(src)) {
      const span = document.createElement('span');
      span.className = 'image-removed';
      span.textContent = words;
      img.replaceWith(span);
      continue;
    }
    const a = document.createElement('a');
    a.className = 'remote-image';
    a.setAttribute('href', src);
    a.setAttribute('target', '_blank');
    a.setAttribute('rel', 'noopener noreferrer nofollow');
    a.title = 'Image, not loaded: open it in a new tab';
    a.textContent = words;
    img.replaceWith(a);
  }
}

/** GFM task lists ("- [x] done") keep their checkboxes, shown and never editable; any
 * other input is dropped. Each is named by its item's text (what a label would give). */
function taskCheckboxes(root: DocumentFragment): void {
  for (const input of Array.from(root.querySelectorAll('input'))) {
    const item = input.closest('li');
    if ((input.getAttribute('type') || '').toLowerCase() !== 'checkbox' || !item) {
      input.remove();
      continue;
    }
    const checked = input.hasAttribute('checked');
    for (const a of Array.from(input.attributes)) input.removeAttribute(a.name);
    input.setAttribute('type', 'checkbox');
    input.setAttribute('disabled', '');
    if (checked) input.setAttribute('checked', '');
    input.className = 'task-check';
    input.setAttribute('aria-label', (item.textContent || '').trim().slice(0, 200) || (checked ? 'Done' : 'Not done'));
    item.classList.add('task-item');
  }
}

/** A link whose address the sanitizer removed (javascript:, data:, …) or that has none is
 * plain text: it must neither look nor act like a link. */
function unlinkDeadLinks(root: DocumentFragment): void {
  for (const a of Array.from(root.querySelectorAll('a'))) {
    if (a.getAttribute('href')) continue;
    const span = document.createElement('span');
    span.className = 'link-removed';
    span.title = 'Link removed: its address was not safe to open';
    span.append(...Array.from(a.childNodes));
    a.replaceWith(span);
  }
}

/**
 * Markdown → sanitised HTML. Works on partial text while a reply streams: an unclosed code
 * fence renders as a code block up to the end (CommonMark), so nothing jumps when it closes.
 */
export function renderMarkdown(text: string, streaming = false): string {
  let src = text;
  // A fence opener still being typed ("``" or "```py" with no newline yet) would flash as
  // inline code; hold the last line back until it is complete.
  const lastNl = src.lastIndexOf('\n');
  const lastLine = src.slice(lastNl + 1);
  if (streaming && /^\s{0,3}(`{1,2}|`{3,}[^`\n]*|~{1,2}|~{3,}[^\n]*)$/.test(lastLine)) {
    src = src.slice(0, lastNl + 1);
  }
  mathSlots.length = 0;
  const html = md.parse(src, { async: false }) as string;
  const fragment = purifier().sanitize(html, { ...PURIFY_CONFIG, RETURN_DOM_FRAGMENT: true }) as unknown as DocumentFragment;
  imagesAsLinks(fragment);
  unlinkDeadLinks(fragment);
  taskCheckboxes(fragment);
  fillMath(fragment, mathSlots);
  const out = document.createElement('div');
  out.appendChild(fragment);
  return out.innerHTML;
}
