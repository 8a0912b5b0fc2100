import { describe, expect, it } from 'vitest';
import { FALLBACK_LIMITS, fieldError, rangeText, validateSettings, withinLimits, type ChatLimits } from '../src/limits';
import { createChat } from '../src/chat';
import { FakeApi, FakePort } from './fakes';

/** What GET /api/chat/limits/ answers with CHAT_MAX_NEW_TOKENS=2048 (docs/http.md). */
export const SERVER: ChatLimits = {
  max_tokens: { min: 1, max: 2048, default: 512 },
  temperature: { min: 0, max: 2, default: 0.7 },
  top_p: { min: 0, min_exclusive: true, max: 1, default: 0.95 },
  system_prompt: { max_chars: 100, default: '' },
  message: { max_chars: 32000, max_frame_bytes: 262144 },
  context_tokens: 8192,
};

const values = (over: Partial<Record<'system_prompt' | 'temperature' | 'top_p' | 'max_tokens', string>> = {}) => ({
  json_mode: false,
  system_prompt: '',
  temperature: '0.7',
  top_p: '0.95',
  max_tokens: '512',
  ...over,
});

describe('settings validation against the server limits', () => {
  it('says the range in human words, with thousands separators', () => {
    expect(fieldError('max_tokens', '4000', SERVER)).toBe('Max tokens must be between 1 and 2,048.');
    expect(fieldError('max_tokens', '0', SERVER)).toBe('Max tokens must be between 1 and 2,048.');
    expect(rangeText(SERVER.max_tokens)).toBe('1–2,048');
  });

  it('accepts both ends of a range and refuses just past them', () => {
    expect(fieldError('max_tokens', '1', SERVER)).toBe('');
    expect(fieldError('max_tokens', '2048', SERVER)).toBe('');
    expect(fieldError('max_tokens', '2049', SERVER)).not.toBe('');
    expect(fieldError('temperature', '0', SERVER)).toBe('');
    expect(fieldError('temperature', '2', SERVER)).toBe('');
    expect(fieldError('temperature', '2.01', SERVER)).toBe('Temperature must be between 0 and 2.');
    // top_p's minimum is exclusive
    expect(fieldError('top_p', '0', SERVER)).toBe('Top-p must be more than 0 and at most 1.');
    expect(fieldError('top_p', '0.01', SERVER)).toBe('');
    expect(fieldError('top_p', '1', SERVER)).toBe('');
  });

  it('refuses empty, non-numeric and fractional values', () => {
    expect(fieldError('max_tokens', '', SERVER)).toBe('Max tokens is required.');
    expect(fieldError('temperature', 'hot', SERVER)).toBe('Temperature must be a number.');
    expect(fieldError('max_tokens', '12.5', SERVER)).toBe('Max tokens must be a whole number.');
  });

  it('follows the limits it is given, not a built-in copy', () => {
    const low = { ...SERVER, max_tokens: { min: 1, max: 300, default: 100 } };
    expect(fieldError('max_tokens', '512', low)).toBe('Max tokens must be between 1 and 300.');
    expect(fieldError('max_tokens', '512', SERVER)).toBe('');
  });

  it('gives settings only when every field is valid', () => {
    const ok = validateSettings(values({ max_tokens: '2048', system_prompt: 'Be brief.' }), SERVER);
    expect(ok.errors).toEqual({});
    expect(ok.settings).toEqual({ system_prompt: 'Be brief.', temperature: 0.7, top_p: 0.95, max_tokens: 2048, json_mode: false });
    const bad = validateSettings(values({ max_tokens: '4000', system_prompt: 'x'.repeat(101) }), SERVER);
    expect(bad.settings).toBeUndefined();
    expect(bad.errors).toEqual({
      max_tokens: 'Max tokens must be between 1 and 2,048.',
      system_prompt: 'The system prompt is longer than 100 characters.',
    });
  });

  it('drops out-of-range values from settings about to be sent', () => {
    expect(withinLimits({ max_tokens: 4000, temperature: 0.2 }, SERVER)).toEqual({ temperature: 0.2 });
    expect(withinLimits({ max_tokens: 4000 }, SERVER)).toBeUndefined();
    expect(withinLimits({ top_p: 0, system_prompt: 'ok' }, SERVER)).toEqual({ system_prompt: 'ok' });
    expect(withinLimits({ max_tokens: 2048, top_p: 1 }, SERVER)).toEqual({ max_tokens: 2048, top_p: 1 });
    expect(withinLimits(undefined, SERVER)).toBeUndefined();
  });

  it('falls back to the server defaults until the limits arrive', () => {
    expect(FALLBACK_LIMITS.max_tokens.max).toBe(2048);
  });
});

class LimitsApi extends FakeApi {
  answer = SERVER;
  async limits() {
    this.calls.push(['limits']);
    return this.answer;
  }
}

describe('the limits and a new chat\'s send', () => {
  it('loads the limits and never sends a max_tokens over them in a new chat', async () => {
    const port = new FakePort();
    const api = new LimitsApi();
    api.answer = { ...SERVER, max_tokens: { min: 1, max: 1000, default: 200 } };
    const { conversations, protocol, server } = createChat(port, api);
    protocol.setConn('open');
    await server.loadLimits();
    expect(server.limits.value?.max_tokens.max).toBe(1000);
    // A draft saved before (or around) the limits: 4000 is refused by the server, so left out.
    await conversations.saveSettings(null, { max_tokens: 4000, temperature: 0.1 });
    expect(protocol.sendMessage('hi').ok).toBe(true);
    expect(port.sent[0]).toMatchObject({ type: 'send', settings: { temperature: 0.1 } });
    expect((port.sent[0] as any).settings.max_tokens).toBeUndefined();
  });

  it('uses the built-in limits when the server has no answer', async () => {
    const port = new FakePort();
    const { conversations, protocol, server } = createChat(port, new FakeApi());
    protocol.setConn('open');
    await server.loadLimits();
    expect(server.limits.value).toBeNull();
    await conversations.saveSettings(null, { max_tokens: 4000 });
    expect(protocol.sendMessage('hi').ok).toBe(true);
    expect((port.sent[0] as any).settings).toBeUndefined();
  });
});

describe('offline notices', () => {
  it('clears "You are offline" when the socket opens again, and keeps other notices', () => {
    const port = new FakePort();
    const { protocol, ui } = createChat(port, new FakeApi());
    port.isOpen = false;
    protocol.setConn('reconnecting');
    expect(protocol.sendMessage('hello').ok).toBe(false);
    ui.notify('new', 'The server is busy right now.', 'busy');
    expect(ui.noticesFor('new').map((n) => n.code)).toEqual(['offline', 'busy']);
    port.isOpen = true;
    protocol.setConn('open');
    protocol.onOpen(true);
    expect(ui.noticesFor('new').map((n) => n.code)).toEqual(['busy']);
  });
});
