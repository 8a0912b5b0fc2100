import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Conversations } from '../src/conversations';
import { ChatSocket } from '../src/ws';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakeSocket, flush, msg } from './fakes';

let root: HTMLElement;
let m: Mounted;
let conversations: Conversations;
let socket: ChatSocket;
let api: FakeApi;

const $ = (id: string) => root.querySelector(`[data-testid="${id}"]`) as HTMLElement;
const $$ = (id: string) => [...root.querySelectorAll(`[data-testid="${id}"]`)] as HTMLElement[];

async function mount() {
  api = new FakeApi();
  m = await mountApp(api, { hash: true });
  ({ root, socket, conversations } = m);
}

async function type(text: string) {
  const ta = $('composer-input') as HTMLTextAreaElement;
  await act(() => {
    ta.value = text;
    ta.dispatchEvent(new Event('input', { bubbles: true }));
  });
  return ta;
}

async function press(el: Element, key: string, opts: KeyboardEventInit = {}) {
  await act(() => {
    el.dispatchEvent(new KeyboardEvent('keydown', { key, bubbles: true, cancelable: true, ...opts }));
  });
}

async function server(frame: unknown) {
  await act(() => FakeSocket.last().receive(frame));
}

beforeEach(async () => {
  localStorage.clear();
  document.cookie = 'csrftoken=tok123';
  await mount();
});
afterEach(() => m.stop());

describe('chat page', () => {
  it('shows the main controls with their test ids', () => {
    for (const id of ['sidebar', 'new-chat', 'conversation-search', 'composer-input', 'send-button', 'settings-button', 'theme-toggle', 'connection-status', 'message-list', 'empty-state', 'logout-button']) {
      expect($(id), id).not.toBeNull();
    }
    expect($('connection-status').dataset.state).toBe('connecting');
    expect((root.querySelector('input[name=csrfmiddlewaretoken]') as HTMLInputElement).value).toBe('tok123');
  });

  it('refuses to send while disconnected, visibly, and keeps the text', async () => {
    const ta = await type('hello?');
    await press(ta, 'Enter');
    expect(FakeSocket.last().sent).toEqual([]);
    expect($('chat-error').textContent).toMatch(/offline/i);
    expect(ta.value).toBe('hello?');
    expect($('composer-offline')).not.toBeNull();
  });

  it('sends with Enter, streams markdown, stops, and shows figures', async () => {
    await act(() => FakeSocket.last().open());
    expect($('connection-status').dataset.state).toBe('open');
    const ta = await type('Write code');
    await press(ta, 'Enter', { shiftKey: true }); // Shift+Enter: no send
    expect(FakeSocket.last().sent).toEqual([]);
    await press(ta, 'Enter');
    const sent = FakeSocket.last().sent[0];
    expect(sent).toMatchObject({ type: 'send', conversation_id: null, text: 'Write code' });
    expect(ta.value).toBe('');
    expect($$('message')).toHaveLength(1);
    expect($('message').dataset.status).toBe('sending');

    await server({ type: 'conversation', conversation: conv(7, 'Write code') });
    await server({ type: 'start', conversation_id: 7, client_id: sent.client_id, user_message: msg({ id: 14, role: 'user', conversation_id: 7, text: 'Write code' }), message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 14 }) });
    expect($$('conversation-item')[0].dataset.conversationId).toBe('7');
    expect($$('conversation-item')[0].dataset.active).toBe('true');
    expect($('conversation-title').textContent).toBe('Write code');
    const reply = root.querySelector('[data-message-id="15"]') as HTMLElement;
    expect(reply.dataset.role).toBe('assistant');
    expect(reply.dataset.status).toBe('streaming');
    expect($('stop-button')).not.toBeNull();
    expect($('send-button')).toBeNull();

    await server({ type: 'delta', message_id: 15, text: 'Sure:\n\n```py\nprint(' });
    expect(reply.querySelector('pre code')!.textContent).toBe('print(');
    await server({ type: 'delta', message_id: 15, text: '"hi")\n```\n\n**Done**' });
    expect(reply.querySelector('strong')!.textContent).toBe('Done');

    await act(() => $('stop-button').click());
    expect(FakeSocket.last().sent.at(-1)).toEqual({ type: 'stop', message_id: 15 });
    await server({ type: 'done', message_id: 15, status: 'stopped', finish_reason: 'abort', figures: { ttft_ms: 84.2, output_tokens: 8, tokens_per_s: 41.7, prompt_tokens: 31, cached_tokens: 0 } });
    expect(reply.dataset.status).toBe('stopped');
    const figures = reply.querySelector('[data-testid="message-figures"]') as HTMLElement;
    expect(figures.dataset.ready).toBe('true');
    expect(figures.textContent).toContain('84 ms');
    expect(figures.textContent).toContain('41.7 tok/s');
    expect(figures.textContent).toContain('8 tokens');
    expect($('send-button')).not.toBeNull();
    expect(reply.querySelector('[data-testid="message-regenerate"]')).not.toBeNull();
    expect(location.hash).toBe('#/c/7');
  });

  it('shows error frames in plain words', async () => {
    await act(() => FakeSocket.last().open());
    const ta = await type('hi');
    await press(ta, 'Enter');
    const cid = FakeSocket.last().sent[0].client_id;
    await server({ type: 'error', code: 'engine_unavailable', message: 'engine down', client_id: cid });
    expect($('chat-error').textContent).toMatch(/not running/);
    expect($('chat-error').dataset.code).toBe('engine_unavailable');
    expect(($('composer-input') as HTMLTextAreaElement).value).toBe('hi');
  });

  it('resumes a reply that was streaming when the page loaded', async () => {
    api.convs.set(3, { conversation: conv(3, 'Resume me'), messages: [msg({ id: 1, role: 'user', conversation_id: 3, text: 'q' }), msg({ id: 2, role: 'assistant', conversation_id: 3, status: 'streaming', text: 'So far', parent_id: 1 })] });
    await act(async () => {
      await conversations.select(3);
    });
    await act(() => FakeSocket.last().open());
    expect(FakeSocket.last().sent).toEqual([{ type: 'resume', message_id: 2 }]);
    await server({ type: 'snapshot', message: msg({ id: 2, role: 'assistant', conversation_id: 3, status: 'streaming', text: 'So far so', parent_id: 1 }) });
    await server({ type: 'delta', message_id: 2, text: ' good' });
    expect(root.querySelector('[data-message-id="2"] [data-testid="message-content"]')!.textContent).toContain('So far so good');
    await server({ type: 'done', message_id: 2, status: 'complete', finish_reason: 'stop', figures: { ttft_ms: 10, output_tokens: 3, tokens_per_s: 20, prompt_tokens: 5, cached_tokens: 4 } });
    expect((root.querySelector('[data-message-id="2"]') as HTMLElement).dataset.status).toBe('complete');
  });

  it('Esc stops, Ctrl+Shift+O starts a new chat, theme toggle persists', async () => {
    await act(() => FakeSocket.last().open());
    conversations.apply(conv(4), [msg({ id: 1, role: 'user', conversation_id: 4 }), msg({ id: 2, role: 'assistant', conversation_id: 4, status: 'streaming', parent_id: 1 })]);
    await act(() => conversations.select(4));
    await press(window as any, 'Escape');
    expect(FakeSocket.last().sent).toContainEqual({ type: 'stop', message_id: 2 });
    await press(window as any, 'O', { ctrlKey: true, shiftKey: true });
    expect(conversations.currentId.value).toBeNull();
    expect($('conversation-title').textContent).toBe('New chat');

    const before = document.documentElement.dataset.theme;
    await act(() => $('theme-toggle').click());
    const after = document.documentElement.dataset.theme;
    expect(after).not.toBe(before);
    expect(localStorage.getItem('chat.theme')).toBe(after);
    expect($('theme-toggle').dataset.theme).toBe(after);
  });

  it('opens the settings dialog and saves a new chat’s settings', async () => {
    await act(() => $('settings-button').click());
    expect($('settings-dialog')).not.toBeNull();
    const t = $('settings-temperature') as HTMLInputElement;
    await act(() => {
      t.value = '3';
      t.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(() => $('settings-save').click());
    expect($('settings-error').textContent).toMatch(/between 0 and 2/);
    await act(() => {
      t.value = '0.3';
      t.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(async () => {
      $('settings-save').click();
      await flush();
    });
    expect($('settings-dialog')).toBeNull();
    expect(conversations.draftSettings.value.temperature).toBe(0.3);
  });

  it('renames and deletes a conversation with confirmation', async () => {
    api.convs.set(5, { conversation: conv(5, 'Five'), messages: [] });
    await act(() => conversations.refreshList());
    await act(() => $('conversation-rename').click());
    const input = $('conversation-rename-input') as HTMLInputElement;
    await act(() => {
      input.value = 'Renamed';
      input.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(async () => {
      input.dispatchEvent(new KeyboardEvent('keydown', { key: 'Enter', bubbles: true }));
      await flush();
    });
    expect($('conversation-open').textContent).toBe('Renamed');
    await act(() => $('conversation-delete').click());
    expect($('conversation-delete-prompt')).not.toBeNull();
    await act(async () => {
      $('conversation-delete-confirm').click();
      await flush();
    });
    expect($$('conversation-item')).toHaveLength(0);
    expect(api.calls).toContainEqual(['remove', 5]);
  });

  it('Esc cancels a rename even when the input then fires blur (as Chromium does)', async () => {
    api.convs.set(5, { conversation: conv(5, 'Five'), messages: [] });
    await act(() => conversations.refreshList());
    await act(() => $('conversation-rename').click());
    const input = $('conversation-rename-input') as HTMLInputElement;
    await act(() => {
      input.value = 'Cancelled';
      input.dispatchEvent(new Event('input', { bubbles: true }));
    });
    await act(async () => {
      input.focus();
      input.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true }));
      input.blur();
      await flush();
    });
    expect($('conversation-rename-input')).toBeNull();
    expect($('conversation-open').textContent).toBe('Five');
    expect(api.calls.filter((c) => c[0] === 'patch')).toHaveLength(0);
  });

  it('flips between alternatives', async () => {
    const msgs = [msg({ id: 1, role: 'user', text: 'q' }), msg({ id: 2, role: 'assistant', text: 'first', parent_id: 1, alternatives: [2, 3], alternative_index: 0 })];
    api.convs.set(1, { conversation: conv(1), messages: msgs });
    await act(() => conversations.select(1));
    expect($('alt-counter').textContent).toBe('1/2');
    api.convs.get(1)!.messages[1] = msg({ id: 3, role: 'assistant', text: 'second', parent_id: 1, alternatives: [2, 3], alternative_index: 1 });
    await act(async () => {
      $('alt-next').click();
      await flush();
      await flush();
    });
    expect(api.calls).toContainEqual(['patch', 1, { active_message: 3 }]);
    expect($('alt-counter').textContent).toBe('2/2');
    expect(root.querySelector('[data-message-id="3"]')!.textContent).toContain('second');
  });
});

describe('auto-scroll', () => {
  it('follows new text, lets go when the reader scrolls up, and comes back with the button', async () => {
    await act(() => FakeSocket.last().open());
    conversations.apply(conv(4), [msg({ id: 1, role: 'user', conversation_id: 4 }), msg({ id: 2, role: 'assistant', conversation_id: 4, status: 'streaming', parent_id: 1 })]);
    await act(() => conversations.select(4));
    const list = $('message-list');
    let height = 1000;
    Object.defineProperty(list, 'scrollHeight', { get: () => height, configurable: true });
    Object.defineProperty(list, 'clientHeight', { get: () => 400, configurable: true });
    await server({ type: 'delta', message_id: 2, text: 'more text' });
    expect(list.scrollTop).toBe(1000); // followed the bottom (jsdom does not clamp)
    // the reader scrolls up
    await act(() => {
      list.scrollTop = 300;
      list.dispatchEvent(new Event('scroll'));
    });
    height = 1400;
    await server({ type: 'delta', message_id: 2, text: ' and more' });
    expect(list.scrollTop).toBe(300); // stayed where the reader is
    expect($('scroll-bottom')).not.toBeNull();
    await act(() => $('scroll-bottom').click());
    expect(list.scrollTop).toBe(1400);
    expect($('scroll-bottom')).toBeNull();
  });

  it('lets go however little the reader scrolls up, and follows again once they are back at the bottom', async () => {
    await act(() => FakeSocket.last().open());
    conversations.apply(conv(4), [msg({ id: 1, role: 'user', conversation_id: 4 }), msg({ id: 2, role: 'assistant', conversation_id: 4, status: 'streaming', parent_id: 1 })]);
    await act(() => conversations.select(4));
    const list = $('message-list');
    // A browser's scroller: scrollTop stays within [0, scrollHeight - clientHeight].
    let height = 1000;
    let top = 0;
    Object.defineProperty(list, 'scrollHeight', { get: () => height, configurable: true });
    Object.defineProperty(list, 'clientHeight', { get: () => 400, configurable: true });
    Object.defineProperty(list, 'scrollTop', {
      get: () => top,
      set: (v: number) => void (top = Math.max(0, Math.min(v, height - 400))),
      configurable: true,
    });
    const scrollTo = (v: number) =>
      act(() => {
        list.scrollTop = v;
        list.dispatchEvent(new Event('scroll'));
      });
    await server({ type: 'delta', message_id: 2, text: 'more text' });
    expect(list.scrollTop).toBe(600);
    // 10 px up (a touchpad step, a smooth scroll's first frame): well within "near the bottom"
    await scrollTo(590);
    height = 1100;
    await server({ type: 'delta', message_id: 2, text: ' and more' });
    expect(list.scrollTop).toBe(590); // not pulled back down
    expect($('scroll-bottom')).not.toBeNull();
    // back near the bottom by scrolling down: following again
    await scrollTo(680);
    expect($('scroll-bottom')).toBeNull();
    height = 1200;
    await server({ type: 'delta', message_id: 2, text: ' and yet more' });
    expect(list.scrollTop).toBe(800);
    // content shrinking moves the view up, but that is not the reader letting go
    height = 1150;
    await scrollTo(list.scrollTop);
    height = 1300;
    await server({ type: 'delta', message_id: 2, text: ' and the end' });
    expect(list.scrollTop).toBe(900);
    expect($('scroll-bottom')).toBeNull();
  });
});
