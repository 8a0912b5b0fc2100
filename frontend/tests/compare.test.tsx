import { act } from 'preact/test-utils';
import { afterEach, describe, expect, it } from 'vitest';
import type { ModelsInfo } from '../src/types';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakeSocket, flush, msg } from './fakes';

/** Compare two models (issue 45, item 15): a second served model answers the same message. */
class ModelsApi extends FakeApi {
  constructor(private readonly ids: string[]) {
    super();
  }
  async models(): Promise<ModelsInfo> {
    return { default: this.ids[0], models: this.ids.map((id, i) => ({ id, default: i === 0, context_tokens: 2048 })) };
  }
}

async function mount(ids: string[]): Promise<{ m: Mounted; api: ModelsApi }> {
  localStorage.clear();
  const api = new ModelsApi(ids);
  api.convs.set(4, {
    conversation: { ...conv(4), model: 'main' },
    messages: [msg({ id: 40, role: 'user', conversation_id: 4, text: 'Hi' }), msg({ id: 41, role: 'assistant', conversation_id: 4, parent_id: 40, text: 'Hello', model: 'main' })],
  });
  const m = await mountApp(api);
  await act(async () => {
    await m.server.loadModels();
    await m.conversations.refreshList();
  });
  await act(() => {
    FakeSocket.last().open();
  });
  await act(() => m.conversations.select(4));
  await act(async () => {
    await flush();
  });
  return { m, api };
}

/** The server's answer to a compared send (`sent`): the first reply's start frame, then the
 * second's, both streaming. */
async function startBoth(m: Mounted, sent: Record<string, unknown>) {
    const user = msg({ id: 42, role: 'user', conversation_id: 4, parent_id: 41, text: 'Colors?' });
    const first = msg({ id: 43, role: 'assistant', conversation_id: 4, parent_id: 42, text: '', status: 'streaming', model: 'main' });
    const second = msg({ id: 44, role: 'assistant', conversation_id: 4, parent_id: 42, text: '', status: 'streaming', model: 'twin' });
  await act(async () => {
    m.protocol.handleFrame({ type: 'start', conversation_id: 4, client_id: sent.client_id as string, user_message: user, message: first });
    m.protocol.handleFrame({ type: 'start', conversation_id: 4, user_message: null, message: second, compare_to: 43 });
    await flush();
  });
  return { first, second };
}

describe('compare', () => {
  let m: Mounted;
  afterEach(() => m.stop());
  const $ = (id: string) => m.root.querySelector(`[data-testid="${id}"]`) as HTMLElement;

  it('is not offered with one model served', async () => {
    ({ m } = await mount(['main']));
    expect($('model-picker')).not.toBeNull();
    expect($('compare-picker')).toBeNull();
  });

  it('asks the second model too, shows both answers side by side, and keeps the one picked', async () => {
    let api: ModelsApi;
    ({ m, api } = await mount(['main', 'twin']));
    const picker = $('compare-picker') as HTMLSelectElement;
    expect([...picker.options].map((o) => o.value)).toEqual(['', 'twin']);
    await act(async () => {
      picker.value = 'twin';
      picker.dispatchEvent(new Event('change', { bubbles: true }));
      await flush();
    });
    m.protocol.sendMessage('Colors?');
    const sent = FakeSocket.last().sent.at(-1) as Record<string, unknown>;
    expect(sent).toMatchObject({ type: 'send', conversation_id: 4, model: 'main', compare_model: 'twin' });
    expect(m.protocol.compareWith.value).toBeNull();
    const { first, second } = await startBoth(m, sent);
    await act(async () => {
      m.protocol.handleFrame({ type: 'delta', message_id: 43, text: 'Red', seq: 1 });
      m.protocol.handleFrame({ type: 'delta', message_id: 44, text: 'Blue', seq: 1 });
      await flush();
    });
    expect(m.conversations.thread(4)).toEqual([40, 41, 42, 43]);
    const columns = [...m.root.querySelectorAll('[data-testid="compare-col"]')] as HTMLElement[];
    expect(columns.map((c) => [c.dataset.model, c.querySelector('[data-testid="message-content"]')?.textContent?.trim()])).toEqual([
      ['main', 'Red'],
      ['twin', 'Blue'],
    ]);
    const keep = () => [...m.root.querySelectorAll('[data-testid="compare-keep"]')] as HTMLButtonElement[];
    expect(keep().map((b) => b.disabled)).toEqual([true, true]);
    await act(async () => {
      m.protocol.handleFrame({ type: 'done', message_id: 43, status: 'complete', message: { ...first, text: 'Red', status: 'complete' } });
      m.protocol.handleFrame({ type: 'done', message_id: 44, status: 'complete', message: { ...second, text: 'Blue', status: 'complete' } });
      await flush();
    });
    expect(keep().map((b) => b.disabled)).toEqual([false, false]);
    await act(async () => {
      keep()[1].click();
      await flush();
    });
    expect(api.calls).toContainEqual(['patch', 4, { active_message: 44 }]);
    expect($('compare')).toBeNull();
  });

  it('stops both answers with one Stop, and the second alone once the first has ended', async () => {
    ({ m } = await mount(['main', 'twin']));
    m.protocol.compareWith.value = 'twin';
    m.protocol.sendMessage('Colors?');
    const socket = FakeSocket.last();
    const sent = socket.sent.at(-1) as Record<string, unknown>;
    const { first } = await startBoth(m, sent);
    const stops = () => socket.sent.filter((f) => (f as { type: string }).type === 'stop').map((f) => (f as { message_id: number }).message_id);
    expect(m.protocol.stop()).toBe(true);
    expect(stops().sort()).toEqual([43, 44]);
    await act(async () => {
      m.protocol.handleFrame({ type: 'done', message_id: 43, status: 'complete', message: { ...first, text: 'Red', status: 'complete' } });
      await flush();
    });
    expect(m.protocol.stop()).toBe(true);
    expect(stops().filter((id) => id === 44).length).toBe(2);
  });
});
