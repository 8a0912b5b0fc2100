import { describe, expect, it } from 'vitest';
import { renderMarkdown } from '../src/markdown';
import { applyMathStyles, safeStyle } from '../src/math';

function dom(text: string, streaming = false): HTMLElement {
  const d = document.createElement('div');
  d.innerHTML = renderMarkdown(text, streaming);
  applyMathStyles(d);
  return d;
}

/** The TeX source KaTeX keeps in its MathML annotation, one per formula. */
const formulas = (d: HTMLElement) => [...d.querySelectorAll('annotation')].map((a) => a.textContent);

describe('math', () => {
  it('typesets $…$ inline and $$…$$ as display math', () => {
    const d = dom('Energy is $E = mc^2$ here.\n\n$$\n\\int_0^1 x\\,dx = \\frac{1}{2}\n$$\n\nAnd $$a^2+b^2$$ too.');
    expect(formulas(d)).toEqual(['E = mc^2', '\\int_0^1 x\\,dx = \\frac{1}{2}', 'a^2+b^2']);
    expect(d.querySelector('p .math .katex')).not.toBeNull();
    expect(d.querySelector('div.math-display .katex-display')).not.toBeNull();
    expect(d.querySelector('p .math-display .katex-display')).not.toBeNull();
    expect(d.textContent).toContain('Energy is');
    // MathML for screen readers; the visual copy is hidden from them.
    expect(d.querySelector('.katex-html')!.getAttribute('aria-hidden')).toBe('true');
  });

  it('leaves prices and other dollars as text', () => {
    for (const text of [
      'It costs $5 and $10 at most.',
      'From $20,000 to $30,000.',
      'Either $5/$10 or nothing.',
      'A $ sign, and another $ sign.',
      'Spaces inside: $ x $ stays text.',
      'Escaped: \\$x\\$ is not math.',
      'Code: `$x$` and\n\n```\n$y$\n```',
      'Just one $dollar.',
    ]) {
      const d = dom(text);
      expect(d.querySelector('.katex'), text).toBeNull();
    }
    expect(dom('It costs $5 and $10 at most.').textContent).toContain('$5 and $10');
    expect(dom('Escaped: \\$x\\$ is not math.').textContent).toContain('$x$');
  });

  it('finds math next to prices and punctuation', () => {
    expect(formulas(dom('Pay $5, then solve $x+1=2$.'))).toEqual(['x+1=2']);
    expect(formulas(dom('(see $\\alpha$), $\\beta$!'))).toEqual(['\\alpha', '\\beta']);
    expect(formulas(dom('$a$$b$'))).toHaveLength(2);
  });

  it('shows a formula still being written as text, and a broken one as an error in place', () => {
    expect(dom('So $x^', true).querySelector('.katex')).toBeNull();
    expect(dom('So $x^', true).textContent).toContain('$x^');
    const bad = dom('Broken: $\\frac{1}{$ here');
    expect(bad.querySelector('.katex-error')).not.toBeNull();
    expect(bad.textContent).toContain('here');
  });

  it('keeps hostile input inside math inert', () => {
    const hostile = [
      '$\\href{javascript:alert(1)}{click}$',
      '$\\url{javascript:alert(2)}$',
      '$\\htmlStyle{background:url(https://evil.example/s)}{x}$',
      '$\\htmlClass{copy-code}{x}$',
      '$\\htmlData{onclick=alert(3)}{x}$',
      '$\\includegraphics{https://evil.example/i.png}$',
      '$\\color{red;background:url(https://evil.example/c)}{x}$',
      '$\\text{<img src=x onerror=alert(4)>}$',
      '$$<script>alert(5)</script>$$',
      '$$\n\\def\\a{\\a\\a}\\a\n$$',
      '$\\rule{100000em}{100000em}$',
      '<span data-math-slot="0"></span><div data-math-slot="7"></div> $x$',
      '$x$<script>alert(6)</script>$y$',
    ];
    for (const text of hostile) {
      const d = dom(text);
      expect(d.querySelector('script, img, a, iframe, object, embed, image, use, foreignObject'), text).toBeNull();
      for (const el of d.querySelectorAll('*')) {
        for (const a of el.attributes) {
          expect(a.name, text).not.toMatch(/^on/i);
          // (a title is inert text: KaTeX's error title quotes the source)
          if (a.name !== 'title') expect(a.value, text).not.toMatch(/javascript:|url\(|evil\.example/i);
        }
      }
    }
    expect(dom(hostile[0]).querySelector('.katex [mathcolor], .katex-error')).not.toBeNull(); // \href is refused, in red
    // A huge \rule is capped (maxSize) instead of covering the page.
    const rule = dom(hostile[10]).querySelector('.katex-html .katex-rule') as HTMLElement;
    expect(parseFloat(rule.style.borderRightWidth)).toBe(20);
    expect(parseFloat(rule.style.borderTopWidth)).toBe(20);
  });

  it('carries KaTeX\'s layout outside the markup (the page allows no inline style), and none a reply brings', () => {
    const html = renderMarkdown('$\\frac{a}{b}$ <span data-math-style="position:fixed;inset:0">cover</span>');
    expect(html).not.toMatch(/\sstyle=/);
    const d = dom('$\\frac{a}{b}$ <span data-math-style="position:fixed;inset:0">cover</span>');
    expect(d.querySelectorAll('.katex [data-math-style]').length).toBeGreaterThan(0);
    expect(d.querySelectorAll('[data-math-style]:not(.katex *)')).toHaveLength(0);
    const strut = d.querySelector('.katex .katex-strut') as HTMLElement;
    expect(strut.style.height).toMatch(/em$/);
  });

  it('keeps only the plain style properties KaTeX writes', () => {
    expect(safeStyle('height:0.6833em;vertical-align:-0.0833em')).toBe('height:0.6833em;vertical-align:-0.0833em');
    expect(safeStyle('color:red;background:url(https://evil.example/x)')).toBe('color:red');
    // position:fixed would let a reply cover the page; KaTeX only ever writes relative.
    expect(safeStyle('background-image:url(x);position:fixed;top:0')).toBe('top:0');
    expect(safeStyle('position:relative;top:0.2em')).toBe('position:relative;top:0.2em');
    expect(safeStyle('width:expression(alert(1))')).toBe('');
  });
});

describe('task lists and removed links', () => {
  it('shows task-list checkboxes, disabled, named by their item', () => {
    const d = dom('- [x] buy milk\n- [ ] write the report\n- plain item');
    const boxes = [...d.querySelectorAll('input')] as HTMLInputElement[];
    expect(boxes).toHaveLength(2);
    expect(boxes.map((b) => [b.type, b.disabled, b.checked])).toEqual([
      ['checkbox', true, true],
      ['checkbox', true, false],
    ]);
    expect(boxes[0].getAttribute('aria-label')).toBe('buy milk');
    expect(d.querySelectorAll('li.task-item')).toHaveLength(2);
  });

  it('drops any other input, and never lets a checkbox be edited', () => {
    const d = dom('<input type="text" value="x"> <input type="password">\n\n- <input type="checkbox" onclick="alert(1)" name="cookie" form="f"> raw');
    const inputs = [...d.querySelectorAll('input')] as HTMLInputElement[];
    expect(inputs).toHaveLength(1);
    expect(inputs[0].disabled).toBe(true);
    expect([...inputs[0].attributes].map((a) => a.name).sort()).toEqual(['aria-label', 'class', 'disabled', 'type']);
  });

  it('renders a link stripped of its dangerous address as plain text', () => {
    const d = dom('[md link](javascript:alert(1)) <a href="javascript:alert(2)">html link</a> <a href="data:text/html,x">data</a> <a>bare</a> [fine](https://example.com)');
    expect([...d.querySelectorAll('a')].map((a) => a.textContent)).toEqual(['fine']);
    expect([...d.querySelectorAll('.link-removed')].map((s) => s.textContent)).toEqual(['md link', 'html link', 'data', 'bare']);
    expect(d.querySelector('.link-removed')!.getAttribute('title')).toMatch(/not safe/);
  });
});
