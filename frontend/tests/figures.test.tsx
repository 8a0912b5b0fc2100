import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { conv, FakeApi, flush, msg } from './fakes';
import { mountApp, type Mounted } from './mount';

let m: Mounted | null = null;
const figures = { ttft_ms: 84.2, output_tokens: 8, tokens_per_s: 41.7, prompt_tokens: 31, cached_tokens: 24 };
const $ = (id: string) => m!.root.querySelector(`[data-testid="${id}"]`) as HTMLElement | null;

async function open(staff: boolean) {
  m?.stop();
  const api = new FakeApi();
  api.convs.set(3, { conversation: conv(3), messages: [msg({ id: 1, role: 'user', conversation_id: 3, text: 'q' }), msg({ id: 2, role: 'assistant', conversation_id: 3, text: 'a', parent_id: 1, figures })] });
  m = await mountApp(api, { staff });
  await act(() => m!.conversations.select(3));
}

async function toggleInSettings() {
  await act(() => $('settings-button')!.click());
  await act(() => $('settings-show-figures')!.click());
  await act(async () => {
    $('settings-save')!.click();
    await flush();
  });
  expect($('settings-dialog')).toBeNull();
}

beforeEach(() => localStorage.clear());
afterEach(() => {
  m?.stop();
  m = null;
});

describe('reply figures', () => {
  it('are off by default for a user who is not staff, and on for staff', async () => {
    await open(false);
    expect($('message-figures')).toBeNull();
    expect($('message')).not.toBeNull();
    await open(true);
    expect($('message-figures')!.textContent).toContain('84 ms');
  });

  it('follow the settings toggle, remembered in this browser over the default', async () => {
    await open(false);
    await act(() => $('settings-button')!.click());
    expect(($('settings-show-figures') as HTMLInputElement).checked).toBe(false);
    await act(() => $('settings-cancel')!.click());
    await toggleInSettings();
    expect($('message-figures')!.querySelector('[data-figure="cached"]')!.textContent).toContain('24 tokens');
    expect(localStorage.getItem('chat.figures')).toBe('on');
    await open(false); // the next page load
    expect($('message-figures')).not.toBeNull();

    await open(true);
    await toggleInSettings();
    expect($('message-figures')).toBeNull();
    expect(localStorage.getItem('chat.figures')).toBe('off');
    await open(true);
    expect($('message-figures')).toBeNull();
  });

  it('change only on Save: Cancel keeps what was shown', async () => {
    await open(true);
    await act(() => $('settings-button')!.click());
    await act(() => $('settings-show-figures')!.click());
    await act(() => $('settings-cancel')!.click());
    expect($('message-figures')).not.toBeNull();
    expect(localStorage.getItem('chat.figures')).toBeNull();
  });
});

describe('the settings dialog right after a page load', () => {
  it('waits for the conversation instead of showing (and saving) defaults', async () => {
    let arrive!: () => void;
    const slow = new FakeApi();
    slow.convs.set(5, { conversation: { ...conv(5), settings: { system_prompt: 'Be terse.' } }, messages: [] });
    const get = slow.get.bind(slow);
    slow.get = async (id: number) => {
      await new Promise<void>((r) => (arrive = r));
      return get(id);
    };
    m?.stop();
    m = await mountApp(slow);
    await act(() => void m!.conversations.select(5));
    await act(() => $('settings-button')!.click());
    expect($('settings-loading')).not.toBeNull();
    expect($('settings-save')).toBeNull();
    await act(async () => {
      arrive();
      await flush();
    });
    expect(($('settings-system-prompt') as HTMLTextAreaElement).value).toBe('Be terse.');
  });
});
