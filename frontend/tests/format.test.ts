import { describe, expect, it } from 'vitest';
import { dayBucket, formatCount, formatMs, formatRate, formatFigures, hasFigures } from '../src/format';
import { errorWords } from '../src/errors';

describe('figures', () => {
  it('formats times', () => {
    expect(formatMs(84.2)).toBe('84 ms');
    expect(formatMs(999.4)).toBe('999 ms');
    expect(formatMs(1234)).toBe('1.23 s');
    expect(formatMs(65000)).toBe('65.0 s');
    expect(formatMs(null)).toBe('–');
    expect(formatMs(NaN)).toBe('–');
  });
  it('formats rates and counts', () => {
    expect(formatRate(41.66)).toBe('41.7 tok/s');
    expect(formatRate(312.4)).toBe('312 tok/s');
    expect(formatRate(undefined)).toBe('–');
    expect(formatCount(1, 'token', 'tokens')).toBe('1 token');
    expect(formatCount(1234, 'token', 'tokens')).toBe('1,234 tokens');
  });
  it('builds the four figures under a reply', () => {
    const f = formatFigures({ ttft_ms: 84.2, output_tokens: 8, tokens_per_s: 41.7, prompt_tokens: 31, cached_tokens: 0 });
    expect(f.map((x) => [x.key, x.value])).toEqual([
      ['ttft', '84 ms'],
      ['rate', '41.7 tok/s'],
      ['tokens', '8 tokens'],
      ['cached', '0 tokens (0%)'],
    ]);
    expect(formatFigures({ cached_tokens: 24, prompt_tokens: 32 })[3].value).toBe('24 tokens (75%)');
    expect(formatFigures(null).every((x) => x.value === '–')).toBe(true);
    expect(hasFigures({ ttft_ms: 3 })).toBe(true);
    expect(hasFigures({})).toBe(false);
    expect(hasFigures(null)).toBe(false);
  });
  it('groups dates for the sidebar', () => {
    const now = new Date('2026-11-30T12:00:00');
    expect(dayBucket('2026-11-30T08:00:00', now)).toBe('Today');
    expect(dayBucket('2026-11-29T08:00:00', now)).toBe('Yesterday');
    expect(dayBucket('2026-11-25T08:00:00', now)).toBe('Previous 7 days');
    expect(dayBucket('2026-01-01T08:00:00', now)).toBe('Older');
    expect(dayBucket('nonsense', now)).toBe('Older');
  });
  it('words errors for people', () => {
    expect(errorWords('busy', 'engine queue full (64)')).toMatch(/busy/);
    expect(errorWords('too_long')).toMatch(/no longer fits/);
    expect(errorWords('engine_unavailable')).toMatch(/not running/);
    expect(errorWords('invalid', 'temperature must be <= 2')).toBe('temperature must be <= 2');
    expect(errorWords('weird_new_code', 'Server says so.')).toBe('Server says so.');
    expect(errorWords(undefined)).toMatch(/went wrong/);
  });
});
