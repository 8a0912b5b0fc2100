import { act } from 'preact/test-utils';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isPaused, pausedWords, stopState } from '../src/paused';
import { mountApp, type Mounted } from './mount';
import { conv, FakeApi, FakeSocket, msg } from './fakes';

describe('paused replies (state)', () => {
  it('a reply being written is paused whenever the socket is not open', () => {
    const streaming = { status: 'streaming' as const };
    expect(isPaused(streaming, 'open')).toBe(false);
    for (const conn of ['reconnecting', 'unavailable', 'connecting', 'unauthorized', 'closed'] as const) {
      expect(isPaused(streaming, conn), conn).toBe(true);
    }
    expect(isPaused({ status: 'complete' }, 'reconnecting')).toBe(false);
    expect(isPaused({ status: 'sending' }, 'reconnecting')).toBe(false);
    expect(isPaused(undefined, 'reconnecting')).toBe(false);
  });

  it('says what happens next, and why Stop is off', () => {
    expect(pausedWords('reconnecting')).toBe('Reconnecting… the reply will continue.');
    expect(pausedWords('unavailable')).toMatch(/cannot run the chat right now/);
    expect(pausedWords('unauthorized')).toMatch(/sign in again/i);
    expect(stopState('open')).toEqual({ enabled: true });
    expect(stopState('reconnecting').enabled).toBe(false);
    expect(stopState('reconnecting').reason).toMatch(/connection is lost/);
    expect(stopState('unavailable').enabled).toBe(false);
    expect(stopState('unauthorized').reason).toMatch(/signed out/);
  });
});

describe('paused replies (page)', () => {
  let m: Mounted;
  let root: HTMLElement;
  const $ = (id: string) => root.querySelector(`[data-testid="${id}"]`) as HTMLElement | null;
  const reply = () => root.querySelector('[data-message-id="15"]') as HTMLElement;
  const text = () => reply().querySelector('[data-testid="message-content"]')!.textContent!.trim();
  const server = (frame: unknown) => act(() => FakeSocket.last().receive(frame));

  beforeEach(async () => {
    localStorage.clear();
    m = await mountApp(new FakeApi());
    root = m.root;
    await act(() => FakeSocket.last().open());
    m.conversations.apply(conv(7), [msg({ id: 14, role: 'user', conversation_id: 7, text: 'Tell me a story' })]);
    await act(() => m.conversations.select(7));
    await server({ type: 'start', conversation_id: 7, user_message: null, message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 14 }) });
    await server({ type: 'delta', message_id: 15, text: 'Once upon', seq: 2 });
  });
  afterEach(() => m.stop());

  async function dropAndComeBack() {
    await act(() => FakeSocket.last().drop(1006));
    expect(reply().dataset.status).toBe('streaming');
    expect(reply().dataset.paused).toBe('true');
    // No blinking cursor: the class that draws it is gone, the words stand in its place.
    expect(reply().classList.contains('status-streaming')).toBe(false);
    expect($('message-paused')!.textContent).toBe('Reconnecting… the reply will continue.');
    const stop = $('stop-button') as HTMLButtonElement;
    expect(stop.disabled).toBe(true);
    expect(stop.title).toMatch(/connection is lost/);
    // Neither a click nor Escape queues a stop that would land after the reply resumed.
    await act(() => stop.click());
    await act(() => {
      window.dispatchEvent(new KeyboardEvent('keydown', { key: 'Escape', bubbles: true, cancelable: true }));
    });
    expect(m.socket.pending).toEqual([]);

    await act(() => m.socket.reconnectNow());
    await act(() => FakeSocket.last().open());
    expect(FakeSocket.last().sent).toContainEqual({ type: 'resume', message_id: 15 });
    expect(FakeSocket.last().sent.filter((f) => f.type === 'stop')).toEqual([]);
    expect(reply().dataset.paused).toBeUndefined();
    expect($('message-paused')).toBeNull();
    expect(($('stop-button') as HTMLButtonElement).disabled).toBe(false);
  }

  it('pauses while offline and keeps streaming after the resume, without repeating text', async () => {
    await dropAndComeBack();
    // The server wrote on meanwhile: the snapshot carries it; an older delta is a repeat.
    await server({ type: 'snapshot', message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'streaming', parent_id: 14, text: 'Once upon a time', seq: 4 }) });
    await server({ type: 'delta', message_id: 15, text: ' a time', seq: 4 });
    await server({ type: 'delta', message_id: 15, text: ', a dragon.', seq: 6 });
    expect(text()).toBe('Once upon a time, a dragon.');
    expect(reply().classList.contains('status-streaming')).toBe(true);
    await server({ type: 'done', message_id: 15, status: 'complete', finish_reason: 'stop', figures: { output_tokens: 6 } });
    expect(reply().dataset.status).toBe('complete');
    expect($('stop-button')).toBeNull();
  });

  it('settles a reply that ended while offline with its final text', async () => {
    await dropAndComeBack();
    await server({ type: 'snapshot', message: msg({ id: 15, role: 'assistant', conversation_id: 7, status: 'stopped', finish_reason: 'interrupted', parent_id: 14, text: 'Once upon a time' }) });
    expect(reply().dataset.status).toBe('stopped');
    expect(text()).toBe('Once upon a time');
    expect($('message-note')!.textContent).toMatch(/Interrupted/);
    expect($('stop-button')).toBeNull();
    expect(($('send-button') as HTMLButtonElement).dataset.online).toBe('true');
  });

  it('says when the server cannot run the chat (close code 4503)', async () => {
    await act(() => FakeSocket.last().drop(4503));
    expect($('message-paused')!.textContent).toMatch(/cannot run the chat right now/);
    expect(($('stop-button') as HTMLButtonElement).disabled).toBe(true);
  });
});
