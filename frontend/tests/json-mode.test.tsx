import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Conversations } from '../src/conversations';
import { cleanSettings } from '../src/protocol';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakeSocket, flush } from './fakes';

let root: HTMLElement;
let m: Mounted;
let conversations: Conversations;
let api: FakeApi;

const $ = (id: string) => root.querySelector(`[data-testid="${id}"]`) as HTMLElement;

async function tick(box: HTMLInputElement) {
  await act(() => box.click());
}

async function save() {
  await act(async () => {
    $('settings-save').click();
    await flush();
  });
}

beforeEach(async () => {
  localStorage.clear();
  document.cookie = 'csrftoken=tok123';
  api = new FakeApi();
  m = await mountApp(api, { hash: true });
  ({ root, conversations } = m);
});
afterEach(() => m.stop());

describe('JSON mode, a conversation setting', () => {
  it('is off by default, and a new chat turned on sends it with its first message', async () => {
    await act(() => FakeSocket.last().open());
    await act(() => $('settings-button').click());
    const box = $('settings-json-mode') as HTMLInputElement;
    expect(box.checked).toBe(false);
    await tick(box);
    await save();
    expect(conversations.draftSettings.value.json_mode).toBe(true);
    expect($('json-mode-on').textContent).toBe('JSON mode'); // said in the header

    const ta = $('composer-input') as HTMLTextAreaElement;
    await act(() => {
      ta.value = 'Two fruits';
      ta.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(() => {
      ta.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true, cancelable: true }));
    });
    expect(FakeSocket.last().sent[0]).toMatchObject({ type: 'send', text: 'Two fruits', settings: { json_mode: true } });
  });

  it('shows a saved conversation’s setting and saves it turned off', async () => {
    api.convs.set(5, { conversation: { ...conv(5, 'Data'), settings: { temperature: 0.2, json_mode: true } }, messages: [] });
    await act(() => conversations.refreshList());
    await act(() => conversations.select(5));
    await act(() => $('json-mode-on').click()); // the header's mark opens the settings
    const box = $('settings-json-mode') as HTMLInputElement;
    expect(box.checked).toBe(true);
    await tick(box);
    await save();
    expect($('settings-dialog')).toBeNull();
    const patch = api.calls.find((c) => c[0] === 'patch');
    expect(patch?.[2].settings).toMatchObject({ temperature: 0.2, json_mode: false });
    expect(conversations.conversation(5)?.settings?.json_mode).toBe(false);
    expect($('json-mode-on')).toBeNull();
  });

  it('Defaults turns it off', async () => {
    await act(() => $('settings-button').click());
    await tick($('settings-json-mode') as HTMLInputElement);
    await act(() => $('settings-reset').click());
    expect(($('settings-json-mode') as HTMLInputElement).checked).toBe(false);
  });

  it('leaves the frame alone while off (the server’s default)', () => {
    expect(cleanSettings({ temperature: 0, json_mode: false })).toEqual({ temperature: 0 });
    expect(cleanSettings({ json_mode: true })).toEqual({ json_mode: true });
  });
});
