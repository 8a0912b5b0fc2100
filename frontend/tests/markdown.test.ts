import { describe, expect, it } from 'vitest';
import { highlight, renderMarkdown } from '../src/markdown';

function dom(html: string): HTMLElement {
  const d = document.createElement('div');
  d.innerHTML = html;
  return d;
}

describe('renderMarkdown', () => {
  it('renders the usual markdown', () => {
    const d = dom(renderMarkdown('# Title\n\nSome **bold** and `code`.\n\n- one\n- two\n\n| a | b |\n|---|---|\n| 1 | 2 |'));
    expect(d.querySelector('h1')!.textContent).toBe('Title');
    expect(d.querySelector('strong')!.textContent).toBe('bold');
    expect(d.querySelectorAll('li')).toHaveLength(2);
    expect(d.querySelector('table td')!.textContent).toBe('1');
  });

  it('renders an unclosed code fence while streaming as a code block', () => {
    const partial = 'Here you go:\n\n```python\ndef f(x):\n    return x';
    const d = dom(renderMarkdown(partial, true));
    const code = d.querySelector('pre code')!;
    expect(code).not.toBeNull();
    expect(code.textContent).toBe('def f(x):\n    return x');
    expect(code.className).toContain('language-python');
    expect(d.querySelector('.hljs-keyword')!.textContent).toBe('def');
    // once closed, the same block stays a block (no jump)
    const done = dom(renderMarkdown(partial + '\n```\n\nDone.'));
    expect(done.querySelector('pre code')!.textContent).toBe('def f(x):\n    return x\n'.trimEnd());
    expect(done.querySelectorAll('p')).toHaveLength(2);
  });

  it('holds back a half-typed fence opener while streaming', () => {
    expect(dom(renderMarkdown('Text\n\n``', true)).textContent!.trim()).toBe('Text');
    expect(dom(renderMarkdown('Text\n\n```py', true)).querySelector('code')).toBeNull();
    // not while final
    expect(dom(renderMarkdown('Text\n\n``')).textContent).toContain('``');
  });

  it('copes with other partial markdown without throwing', () => {
    for (const s of ['**bold', '[link](http://exa', '| a | b |\n|--', '1. one\n2.', '> quote\n>', '<div', '`inline', '~~~']) {
      expect(() => renderMarkdown(s, true)).not.toThrow();
    }
  });

  it('adds a copy button and a language label to code blocks', () => {
    const d = dom(renderMarkdown('```js\nconst a = 1;\n```'));
    expect(d.querySelector('.code-block .copy-code')).not.toBeNull();
    expect(d.querySelector('[data-testid="copy-code"]')).not.toBeNull();
    expect(d.querySelector('.code-lang')!.textContent).toBe('js');
  });

  it('sanitises scripts, event handlers and javascript: links', () => {
    const html = renderMarkdown(
      'hi <script>alert(1)</script> <img src=x onerror="alert(2)"> [click](javascript:alert(3)) <a href="javascript:alert(4)">x</a> <iframe src="https://evil"></iframe> <svg onload=alert(5)></svg> <b style="color:red" onclick="x()">b</b>',
    );
    const d = dom(html);
    expect(d.querySelector('script')).toBeNull();
    expect(d.querySelector('iframe')).toBeNull();
    expect(html).not.toMatch(/onerror|onload|onclick/i);
    expect(html).not.toMatch(/javascript:/i);
    for (const a of d.querySelectorAll('a')) expect(a.getAttribute('href') || '').not.toMatch(/^javascript/i);
    expect(d.querySelector('img')!.getAttribute('onerror')).toBeNull();
    expect(d.querySelector('b')!.getAttribute('style')).toBeNull();
  });

  it('escapes HTML inside code blocks and code languages', () => {
    const d = dom(renderMarkdown('```"><img src=x onerror=alert(1)>\n<script>alert(1)</script>\n```'));
    expect(d.querySelector('script')).toBeNull();
    expect(d.querySelector('img')).toBeNull();
    expect(d.querySelector('code')!.textContent).toContain('<script>alert(1)</script>');
  });

  it('opens links in a new tab without an opener', () => {
    const a = dom(renderMarkdown('[site](https://example.com)')).querySelector('a')!;
    expect(a.getAttribute('href')).toBe('https://example.com');
    expect(a.getAttribute('target')).toBe('_blank');
    expect(a.getAttribute('rel')).toContain('noopener');
  });

  it('highlight escapes unknown languages', () => {
    expect(highlight('<b>', 'nosuchlang')).toBe('&lt;b&gt;');
    expect(highlight('x = 1', 'py')).toContain('hljs-number');
  });
});
