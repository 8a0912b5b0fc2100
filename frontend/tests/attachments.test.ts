import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { humanSize } from '../src/attachments';
import { createChat, type Chat } from '../src/chat';
import { FakeApi, FakePort, flush, msg } from './fakes';

let port: FakePort;
let api: FakeApi;
let chat: Chat;

beforeEach(() => {
  port = new FakePort();
  api = new FakeApi();
  chat = createChat(port, api);
  chat.protocol.setConn('open');
});

afterEach(() => vi.useRealTimers());

const file = (name: string, text: string) => new File([text], name, { type: 'text/plain' });

describe('documents in the composer', () => {
  it('uploads each file, then holds it ready with its size and tokens', async () => {
    const { attachments } = chat;
    const done = attachments.add('new', [file('a.md', 'alpha'), file('b.csv', 'x,y')]);
    expect(attachments.draftsFor('new').map((d) => d.status)).toEqual(['uploading', 'uploading']);
    expect(attachments.uploading('new')).toBe(true);
    await done;
    expect(attachments.draftsFor('new').map((d) => [d.name, d.status, d.size])).toEqual([
      ['a.md', 'ready', 5],
      ['b.csv', 'ready', 3],
    ]);
    expect(attachments.ready('new').map((a) => a.tokens)).toEqual([5, 3]);
  });

  it('keeps a refused file as a chip that says why, and never sends it', async () => {
    await chat.attachments.add('new', [file('cat.png', 'png'), file('notes.txt', 'hello')]);
    const [bad, good] = chat.attachments.draftsFor('new');
    expect(bad.status).toBe('error');
    expect(bad.error).toBe('cat.png is an image.');
    expect(chat.attachments.ready('new').map((a) => a.name)).toEqual([good.name]);
  });

  it('refuses files past the per-message limit without uploading them', async () => {
    await chat.attachments.add('new', [file('1.txt', 'a'), file('2.txt', 'b'), file('3.txt', 'c')], 2);
    expect(chat.attachments.draftsFor('new').map((d) => d.status)).toEqual(['ready', 'ready', 'error']);
    expect(api.calls.filter((c) => c[0] === 'upload')).toHaveLength(2);
  });

  it('removing a chip removes the server copy of a file not sent', async () => {
    await chat.attachments.add('new', [file('a.txt', 'alpha')]);
    const [d] = chat.attachments.draftsFor('new');
    chat.attachments.remove('new', d.key);
    expect(chat.attachments.draftsFor('new')).toEqual([]);
    expect(api.calls).toContainEqual(['removeAttachment', d.info!.id]);
  });
});

describe('sending with documents', () => {
  it('sends the ids with the words, shows them on the message at once, and empties the composer', async () => {
    await chat.attachments.add('new', [file('a.txt', 'alpha')]);
    const docs = chat.attachments.ready('new');
    expect(chat.protocol.sendMessage('Summarise', docs).ok).toBe(true);
    chat.attachments.take('new');
    expect(port.sent[0]).toMatchObject({ type: 'send', text: 'Summarise', attachments: [docs[0].id] });
    const optimistic = chat.conversations.message(chat.conversations.thread('new')[0])!;
    expect(optimistic.attachments?.map((a) => a.name)).toEqual(['a.txt']);
    expect(chat.attachments.draftsFor('new')).toEqual([]);
  });

  it('a message may be its documents alone, but not nothing at all', async () => {
    expect(chat.protocol.sendMessage('  ').ok).toBe(false);
    await chat.attachments.add('new', [file('a.txt', 'alpha')]);
    expect(chat.protocol.sendMessage('', chat.attachments.ready('new')).ok).toBe(true);
    expect(port.sent[0]).toMatchObject({ text: '', attachments: [1] });
  });

  it('a send the server refuses puts its documents back in the composer', async () => {
    await chat.attachments.add('new', [file('big.txt', 'x'.repeat(500))]);
    const docs = chat.attachments.ready('new');
    chat.protocol.sendMessage('Summarise', docs);
    chat.attachments.take('new');
    const cid = (port.sent[0] as any).client_id;
    chat.protocol.handleFrame({ type: 'error', code: 'too_long', message: 'This message needs 520 tokens with the conversation so far.', client_id: cid });
    expect(chat.attachments.ready('new').map((a) => a.id)).toEqual([docs[0].id]);
    // The server's own words: they carry the count.
    expect(chat.ui.noticesFor('new')[0].text).toBe('This message needs 520 tokens with the conversation so far.');
  });

  it('an edit keeps the documents: the frame names none, and words may be left out', () => {
    chat.conversations.putMessage(msg({ id: 5, role: 'user', conversation_id: 1, text: 'Read', attachments: [{ id: 9, name: 'a.txt', kind: 'text', size: 1, tokens: 3, message_id: 5 }] }));
    expect(chat.protocol.edit(5, '').ok).toBe(true);
    expect(port.sent[0]).toEqual({ type: 'edit', message_id: 5, text: '' });
  });
});

describe('the count before sending', () => {
  it('asks once after typing settles and keeps only the newest answer', async () => {
    await chat.attachments.add('new', [file('a.txt', 'x'.repeat(50))]);
    vi.useFakeTimers();
    for (const text of ['W', 'Wh', 'Why']) chat.attachments.measure('new', { conversation_id: null, text }, true);
    expect(chat.attachments.measureFor('new')?.pending).toBe(true);
    await vi.advanceTimersByTimeAsync(300);
    vi.useRealTimers();
    await flush();
    const asked = api.calls.filter((c) => c[0] === 'promptSize');
    expect(asked).toHaveLength(1);
    expect(asked[0][1]).toMatchObject({ text: 'Why', attachments: [1] });
    const m = chat.attachments.measureFor('new')!;
    expect(m.pending).toBe(false);
    expect(m.size).toMatchObject({ prompt_tokens: 60, fits: true });
  });

  it('says when the prompt does not fit the window', async () => {
    api.context = 40;
    await chat.attachments.add('new', [file('a.txt', 'x'.repeat(50))]);
    vi.useFakeTimers();
    chat.attachments.measure('new', { conversation_id: null, text: 'q' }, true);
    await vi.advanceTimersByTimeAsync(300);
    vi.useRealTimers();
    await flush();
    expect(chat.attachments.measureFor('new')!.size).toMatchObject({ fits: false, message: 'This message needs 60 tokens.' });
  });

  it('forgets the count when there is nothing to count', async () => {
    vi.useFakeTimers();
    chat.attachments.measure('new', { conversation_id: null, text: 'q' }, true);
    chat.attachments.measure('new', { conversation_id: null, text: '' }, false);
    await vi.advanceTimersByTimeAsync(300);
    expect(chat.attachments.measureFor('new')).toBeUndefined();
    expect(api.calls.filter((c) => c[0] === 'promptSize')).toHaveLength(0);
  });
});

it('sizes read like the server says them', () => {
  expect([humanSize(13), humanSize(1000), humanSize(1_234_567)]).toEqual(['13 bytes', '1.0 KB', '1.2 MB']);
});
