import { describe, expect, it } from 'vitest';
import { renderMarkdown } from '../src/markdown';

function dom(html: string): HTMLElement {
  const div = document.createElement('div');
  div.innerHTML = html;
  return div;
}

// As chatapp/chat/tool_blocks.py writes an imported ChatGPT conversation's tool activity.
const REPLY = [
  '```tool-call weather.get_forecast\n{\n  "city": "Paris"\n}\n```',
  '```tool-result python\n42 <b>bold</b>\n```',
  'Clear, and 42.',
].join('\n\n');

describe('tool calls in an imported conversation', () => {
  it('show as collapsed blocks that name the tool, not as raw fences', () => {
    const root = dom(renderMarkdown(REPLY));
    const [call, result] = [...root.querySelectorAll('details.tool-block')] as HTMLDetailsElement[];
    expect(call.dataset.testid).toBe('tool-call');
    expect(call.open).toBe(false);
    expect(call.querySelector('summary')!.textContent).toBe('Called tool weather.get_forecast');
    expect(call.querySelector('code.language-json')!.textContent).toBe('{\n  "city": "Paris"\n}');
    expect(result.dataset.testid).toBe('tool-result');
    expect(result.querySelector('summary')!.textContent).toBe('Result from python');
    // Output is text: markup in it is shown, never rendered.
    expect(result.querySelector('b')).toBeNull();
    expect(result.querySelector('pre')!.textContent).toBe('42 <b>bold</b>');
    expect(root.textContent).toContain('Clear, and 42.');
    expect(root.querySelector('.code-block')).toBeNull();
    expect(root.textContent).not.toContain('```');
  });

  it('escapes a hostile tool name', () => {
    const root = dom(renderMarkdown('```tool-call <img/src=x>\nx\n```'));
    expect(root.querySelector('img')).toBeNull();
    expect(root.querySelector('summary code')!.textContent).toBe('<img/src=x>');
  });
});
