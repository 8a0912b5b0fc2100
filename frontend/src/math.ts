import DOMPurify from 'dompurify';
import katex from 'katex';
import 'katex/dist/katex.min.css';
import type { MarkedExtension, Tokens } from 'marked';

/*
 * TeX math in replies, typeset by KaTeX: `$…$` inline, `$$…$$` display.
 *
 * Dollars are also prices, so inline math follows pandoc's rule (the one ChatGPT-style
 * renderers follow too): the opening `$` has a non-space right after it, the closing `$`
 * a non-space right before it and no digit right after it, and neither is escaped. So
 * "$5 and $10" and "$20,000 to $30,000" stay text, and "$x^2$" is math.
 *
 * Safety: KaTeX runs with `trust: false` (\href, \url, \includegraphics, \html… render as
 * errors) and bounded expansion and sizes; what it writes is sanitized again by DOMPurify
 * with an allowlist of exactly the elements, attributes and style properties KaTeX uses.
 *
 * The server's Content-Security-Policy allows no inline style, and KaTeX positions its
 * boxes with style attributes: those travel as `data-math-style` and are applied through
 * the CSSOM once the reply is in the page (applyMathStyles), which the policy allows.
 */

const INLINE = /^\$(?!\s)((?:\\[^]|[^\\$\n])+?)(?<!\s)\$(?!\d)/;
const INLINE_DISPLAY = /^\$\$((?:\\[^]|[^\\$])+?)\$\$/;
const BLOCK = /^ {0,3}\$\$((?:\\[^]|[^\\$]|\$(?!\$))+?)\$\$[ \t]*(?:\n+|$)/;

const KATEX_OPTIONS = { throwOnError: false, trust: false, strict: 'ignore', maxSize: 20, maxExpand: 500 } as const;

interface MathToken extends Tokens.Generic {
  type: 'inlineMath' | 'blockMath';
  tex: string;
  display: boolean;
}

/** Index of the first `$` in `src` that opens math by the rule above, if any. */
function mathStart(src: string): number | undefined {
  for (let i = src.indexOf('$'); i >= 0; i = src.indexOf('$', i + 1)) {
    if (i > 0 && src[i - 1] === '\\') continue;
    const rest = src.slice(i);
    if (INLINE_DISPLAY.test(rest) || INLINE.test(rest)) return i;
    if (rest.startsWith('$$')) i++;
  }
  return undefined;
}

/**
 * The marked extension: math becomes a slot element that `fillMath` later replaces with
 * KaTeX's output (after the rest of the reply went through the main sanitizer).
 */
export function mathExtension(slots: { tex: string; display: boolean }[]): MarkedExtension {
  const slot = (t: MathToken) => {
    slots.push({ tex: t.tex, display: t.display });
    const tag = t.type === 'blockMath' ? 'div' : 'span';
    return `<${tag} data-math-slot="${slots.length - 1}"></${tag}>${t.type === 'blockMath' ? '\n' : ''}`;
  };
  return {
    extensions: [
      {
        name: 'blockMath',
        level: 'block',
        tokenizer(src: string): MathToken | undefined {
          const m = BLOCK.exec(src);
          if (m && m[1].trim()) return { type: 'blockMath', raw: m[0], tex: m[1].trim(), display: true };
          return undefined;
        },
        renderer: (t) => slot(t as MathToken),
      },
      {
        name: 'inlineMath',
        level: 'inline',
        start: mathStart,
        tokenizer(src: string): MathToken | undefined {
          const d = INLINE_DISPLAY.exec(src);
          if (d && d[1].trim()) return { type: 'inlineMath', raw: d[0], tex: d[1].trim(), display: true };
          const m = INLINE.exec(src);
          if (m) return { type: 'inlineMath', raw: m[0], tex: m[1], display: false };
          return undefined;
        },
        renderer: (t) => slot(t as MathToken),
      },
    ],
  };
}

/** Where KaTeX's style attributes travel (see the note at the top). */
const STYLE_ATTR = 'data-math-style';
const MATHML_TAGS = [
  'math', 'semantics', 'annotation', 'mrow', 'mi', 'mn', 'mo', 'ms', 'mtext', 'mspace', 'msup', 'msub', 'msubsup',
  'mfrac', 'msqrt', 'mroot', 'mstyle', 'mpadded', 'mphantom', 'mtable', 'mtr', 'mtd', 'mover', 'munder',
  'munderover', 'menclose',
];
const MATH_PURIFY = {
  ALLOWED_TAGS: ['span', 'svg', 'path', 'line', ...MATHML_TAGS],
  ALLOWED_ATTR: [
    STYLE_ATTR, 'class', 'title', 'aria-hidden', 'xmlns', 'encoding', 'width', 'height', 'viewBox', 'preserveAspectRatio',
    'd', 'x1', 'x2', 'y1', 'y2', 'stroke-width', 'accent', 'accentunder', 'columnalign', 'columnlines',
    'columnspacing', 'rowlines', 'rowspacing', 'display', 'displaystyle', 'fence', 'linethickness', 'lspace',
    'mathbackground', 'mathcolor', 'mathvariant', 'maxsize', 'minsize', 'notation', 'scriptlevel', 'stretchy',
    'voffset',
  ],
  ALLOW_DATA_ATTR: false,
  // Its value looks like "height:1em", which would otherwise be checked as a URL.
  ADD_URI_SAFE_ATTR: [STYLE_ATTR],
};

/** The style properties KaTeX writes, with plain values only (no url(), no functions). */
const STYLE_PROPS = new Set([
  'background-color', 'border', 'border-bottom-width', 'border-color', 'border-right-style', 'border-right-width',
  'border-style', 'border-top-width', 'border-width', 'bottom', 'color', 'height', 'left', 'margin', 'margin-left',
  'margin-right', 'min-width', 'padding-left', 'position', 'top', 'vertical-align', 'width',
]);
const PLAIN_VALUE = /^[#a-z0-9.%\s-]+$/i;

export function safeStyle(style: string): string {
  return style
    .split(';')
    .map((decl) => {
      const at = decl.indexOf(':');
      if (at < 0) return '';
      const prop = decl.slice(0, at).trim().toLowerCase();
      const value = decl.slice(at + 1).trim();
      const ok = STYLE_PROPS.has(prop) && PLAIN_VALUE.test(value) && (prop !== 'position' || value === 'relative');
      return ok ? `${prop}:${value}` : '';
    })
    .filter(Boolean)
    .join(';');
}

// A purifier of its own, so the style hook never touches the rest of the reply.
const mathPurifier = DOMPurify(window);
mathPurifier.addHook('uponSanitizeAttribute', (_node, data) => {
  if (data.attrName !== STYLE_ATTR) return;
  data.attrValue = safeStyle(data.attrValue);
  if (!data.attrValue) data.keepAttr = false;
});

const cache = new Map<string, string>();

/** KaTeX's HTML for one formula (errors shown in place, in red), cached: a streaming reply renders again at every delta. */
function typeset(tex: string, display: boolean): string {
  const key = (display ? 'D' : 'I') + tex;
  let html = cache.get(key);
  if (html === undefined) {
    html = katex.renderToString(tex, { ...KATEX_OPTIONS, displayMode: display });
    if (cache.size >= 300) cache.delete(cache.keys().next().value as string);
    cache.set(key, html);
  }
  return html;
}

/** Replace each math slot in `root` with its typeset formula, sanitized. */
export function fillMath(root: DocumentFragment | Element, slots: { tex: string; display: boolean }[]): void {
  // Only KaTeX's own output may carry styles: none that the reply's HTML brought along.
  for (const el of Array.from(root.querySelectorAll(`[${STYLE_ATTR}]`))) el.removeAttribute(STYLE_ATTR);
  for (const el of Array.from(root.querySelectorAll('[data-math-slot]'))) {
    const s = slots[Number(el.getAttribute('data-math-slot'))];
    if (!s) {
      el.remove();
      continue;
    }
    // Renamed before parsing: even the sanitizer's inert copy would apply (and the CSP
    // report) a style attribute. KaTeX escapes quotes in text, so ` style="` is an attribute.
    const html = typeset(s.tex, s.display).replaceAll(' style="', ` ${STYLE_ATTR}="`);
    const math = mathPurifier.sanitize(html, { ...MATH_PURIFY, RETURN_DOM_FRAGMENT: true });
    const box = document.createElement(s.display && el.tagName === 'DIV' ? 'div' : 'span');
    box.className = s.display ? 'math math-display' : 'math';
    box.appendChild(math);
    el.replaceWith(box);
  }
}

/** Give the formulas inside `root` (in the page) their layout: KaTeX's styles, set through the CSSOM. */
export function applyMathStyles(root: Element): void {
  for (const el of Array.from(root.querySelectorAll<HTMLElement | SVGElement>(`[${STYLE_ATTR}]`))) {
    el.style.cssText = safeStyle(el.getAttribute(STYLE_ATTR) || '');
  }
}
