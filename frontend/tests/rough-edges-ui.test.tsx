import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Conversations } from '../src/conversations';
import type { ServerInfo } from '../src/server-info';
import type { ChatSocket } from '../src/ws';
import { FakeApi, FakeSocket, flush } from './fakes';
import { mountApp, type Mounted } from './mount';

class LimitsApi extends FakeApi {
  async limits() {
    return {
      max_tokens: { min: 1, max: 2048, default: 512 },
      temperature: { min: 0, max: 2, default: 0.7 },
      top_p: { min: 0, min_exclusive: true, max: 1, default: 0.95 },
      system_prompt: { max_chars: 32000, default: '' },
      message: { max_chars: 32000, max_frame_bytes: 262144 },
      context_tokens: 8192,
    };
  }
}

let root: HTMLElement;
let m: Mounted;
let conversations: Conversations;
let server: ServerInfo;
let socket: ChatSocket;

const $ = (id: string) => root.querySelector(`[data-testid="${id}"]`) as HTMLElement;

async function input(el: HTMLElement, value: string) {
  await act(() => {
    (el as HTMLInputElement).value = value;
    el.dispatchEvent(new Event('input', { bubbles: true }));
  });
}

beforeEach(async () => {
  localStorage.clear();
  m = await mountApp(new LimitsApi());
  ({ root, socket, conversations, server } = m);
  await act(() => server.loadLimits());
});
afterEach(() => m.stop());

describe('settings dialog limits', () => {
  it('shows the server range, says what is wrong inline, and does not save out of range', async () => {
    await act(() => $('settings-button').click());
    expect($('settings-max-tokens-range').textContent).toBe('(1–2,048)');
    expect(($('settings-max-tokens') as HTMLInputElement).max).toBe('2048');
    await input($('settings-max-tokens'), '4000');
    expect($('settings-max-tokens-error').textContent).toBe('Max tokens must be between 1 and 2,048.');
    expect($('settings-max-tokens').getAttribute('aria-invalid')).toBe('true');
    await act(async () => {
      $('settings-save').click();
      await flush();
    });
    expect($('settings-dialog')).not.toBeNull();
    expect(conversations.draftSettings.value.max_tokens).toBeUndefined();
    await input($('settings-max-tokens'), '2048');
    expect($('settings-max-tokens-error')).toBeNull();
    await act(async () => {
      $('settings-save').click();
      await flush();
    });
    expect($('settings-dialog')).toBeNull();
    expect(conversations.draftSettings.value.max_tokens).toBe(2048);
  });
});

describe('send while offline', () => {
  it('disables Send with a reason while the socket is down, and clears the offline notice on reconnect', async () => {
    await act(() => FakeSocket.last().open());
    const ta = $('composer-input') as HTMLTextAreaElement;
    await input(ta, 'hello?');
    expect(($('send-button') as HTMLButtonElement).disabled).toBe(false);
    await act(() => FakeSocket.last().drop());
    const send = $('send-button') as HTMLButtonElement;
    expect(send.disabled).toBe(true);
    expect(send.title).toMatch(/offline/i);
    expect(send.getAttribute('aria-describedby')).toBe('composer-offline');
    // Enter still says so in words (and keeps the text).
    await act(() => {
      ta.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true, cancelable: true }));
    });
    expect($('chat-error').textContent).toMatch(/offline/i);
    expect(ta.value).toBe('hello?');
    await act(() => socket.reconnectNow());
    await act(() => FakeSocket.last().open());
    expect($('connection-status').dataset.state).toBe('open');
    expect($('chat-error')).toBeNull();
    expect(($('send-button') as HTMLButtonElement).disabled).toBe(false);
  });
});
