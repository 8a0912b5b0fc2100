import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createChat } from '../src/chat';
import type { ModelsInfo } from '../src/types';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakePort, FakeSocket, flush, msg } from './fakes';

/** The server as GET /api/models/ describes it: two models, `main` the default. */
class TwoModelsApi extends FakeApi {
  async models(): Promise<ModelsInfo> {
    return {
      default: 'main',
      models: [
        { id: 'main', default: true, context_tokens: 2048, architecture: 'LlamaForCausalLM', weight_format: 'GGUF Q4_K_M: 98 Q4_K, 15 Q6_K' },
        { id: 'twin', default: false, context_tokens: 1024 },
      ],
    };
  }
}

async function chatWithModels(api = new TwoModelsApi()) {
  const port = new FakePort();
  const chat = createChat(port, api);
  chat.protocol.setConn('open');
  await chat.server.loadModels();
  return { ...chat, port, api };
}

describe('the model a turn names', () => {
  it('is the default for a new chat, or the one picked for it before its first send', async () => {
    const { protocol, conversations, port } = await chatWithModels();
    protocol.sendMessage('Hello');
    expect(port.sent[0]).toMatchObject({ type: 'send', conversation_id: null, model: 'main' });
    conversations.newChat();
    await conversations.setModel(null, 'twin');
    expect(conversations.draftModel.value).toBe('twin');
  });

  it('is the picked one for the new chat, and the pick goes with the chat once it is saved', async () => {
    const { protocol, conversations, port } = await chatWithModels();
    await conversations.setModel(null, 'twin');
    protocol.sendMessage('Hello');
    expect(port.sent[0]).toMatchObject({ model: 'twin' });
    protocol.handleFrame({ type: 'conversation', conversation: { ...conv(7), model: 'twin' } });
    expect(conversations.draftModel.value).toBeNull();
    expect(conversations.modelOf(7, 'main')).toBe('twin');
  });

  it('is a saved conversation\'s own, for sends, regenerations and edits, and none while it is unknown', async () => {
    const api = new TwoModelsApi();
    api.convs.set(3, {
      conversation: { ...conv(3), model: 'twin' },
      messages: [msg({ id: 30, role: 'user', conversation_id: 3, text: 'Hi' }), msg({ id: 31, role: 'assistant', conversation_id: 3, parent_id: 30, model: 'twin' })],
    });
    const { protocol, conversations, port } = await chatWithModels(api);
    await conversations.select(3);
    protocol.sendMessage('More');
    expect(port.sent.at(-1)).toMatchObject({ type: 'send', conversation_id: 3, model: 'twin' });
    protocol.handleFrame({ type: 'error', code: 'busy', message: 'busy', client_id: (port.sent.at(-1) as { client_id: string }).client_id });
    protocol.regenerate(31);
    expect(port.sent.at(-1)).toEqual({ type: 'regenerate', message_id: 31, model: 'twin' });
    conversations.settle(null);
    protocol.edit(30, 'Hi again');
    expect(port.sent.at(-1)).toEqual({ type: 'edit', message_id: 30, text: 'Hi again', model: 'twin' });
    // A conversation this page has not loaded yet: the server uses the one it stored.
    expect(conversations.modelOf(99, 'main')).toBeUndefined();
  });

  it('is PATCHed when picked for a saved conversation, and put back when the server refuses', async () => {
    const api = new TwoModelsApi();
    api.convs.set(5, { conversation: { ...conv(5), model: 'main' }, messages: [] });
    const { conversations } = await chatWithModels(api);
    await conversations.refreshList();
    expect((await conversations.setModel(5, 'twin')).ok).toBe(true);
    expect(api.calls.at(-1)).toEqual(['patch', 5, { model: 'twin' }]);
    expect(conversations.modelOf(5, 'main')).toBe('twin');
    api.patch = async () => {
      throw new Error("The model 'gone' is not served here; pick one of: main, twin");
    };
    const refused = await conversations.setModel(5, 'gone');
    expect(refused).toEqual({ ok: false, error: "The model 'gone' is not served here; pick one of: main, twin" });
    expect(conversations.modelOf(5, 'main')).toBe('twin');
  });
});

describe('the chat header and replies', () => {
  let m: Mounted;
  let root: HTMLElement;
  const $ = (id: string) => root.querySelector(`[data-testid="${id}"]`) as HTMLElement;

  beforeEach(async () => {
    localStorage.clear();
    const api = new TwoModelsApi();
    api.convs.set(4, {
      conversation: { ...conv(4), model: 'retired' },
      messages: [
        msg({ id: 40, role: 'user', conversation_id: 4, text: 'Hi' }),
        msg({ id: 41, role: 'assistant', conversation_id: 4, parent_id: 40, text: 'Hello', model: 'retired' }),
        msg({ id: 42, role: 'user', conversation_id: 4, parent_id: 41, text: 'And?' }),
        msg({ id: 43, role: 'assistant', conversation_id: 4, parent_id: 42, text: 'Old', model: null }),
      ],
    });
    m = await mountApp(api);
    root = m.root;
    await act(async () => {
      await m.server.loadModels();
      await m.conversations.refreshList();
    });
    await act(() => {
      FakeSocket.last().open();
    });
  });
  afterEach(() => m.stop());

  it('offers the served models, the new chat on the default', () => {
    const picker = $('model-picker') as HTMLSelectElement;
    expect([...picker.options].map((o) => o.value)).toEqual(['main', 'twin']);
    expect(picker.value).toBe('main');
    expect(picker.disabled).toBe(false);
  });

  it('says in each option\'s tooltip what the server knows of the model', () => {
    const titles = [...($('model-picker') as HTMLSelectElement).options].map((o) => o.title);
    expect(titles).toEqual(['LlamaForCausalLM · GGUF Q4_K_M: 98 Q4_K, 15 Q6_K · 2,048 tokens of context', '1,024 tokens of context']);
  });

  it('names the model of each reply and keeps a model no longer served visible, marked', async () => {
    await act(() => m.conversations.select(4));
    await act(async () => {
      await flush();
    });
    const picker = $('model-picker') as HTMLSelectElement;
    expect(picker.value).toBe('retired');
    expect([...picker.options].map((o) => o.textContent)).toEqual(['main', 'twin', 'retired (not served)']);
    const named = [...root.querySelectorAll('[data-testid="message"][data-role="assistant"]')].map(
      (el) => el.querySelector('[data-testid="message-model"]')?.textContent ?? null,
    );
    expect(named).toEqual(['retired', null]);
    await act(async () => {
      picker.value = 'twin';
      picker.dispatchEvent(new Event('change', { bubbles: true }));
      await flush();
    });
    expect(m.conversations.modelOf(4, 'main')).toBe('twin');
    expect(($('model-picker') as HTMLSelectElement).value).toBe('twin');
  });
});
