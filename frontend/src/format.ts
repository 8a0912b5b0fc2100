import type { Message, Figures } from './types';

const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

/** 84.2 → "84 ms", 1234 → "1.23 s", 65000 → "65.0 s". */
export function formatMs(ms: number | null | undefined): string {
  if (!isNum(ms)) return '–';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10000) return `${(ms / 1000).toFixed(2)} s`;
  return `${(ms / 1000).toFixed(1)} s`;
}

/** 41.66 → "41.7 tok/s", 312.4 → "312 tok/s". */
export function formatRate(tps: number | null | undefined): string {
  if (!isNum(tps)) return '–';
  if (tps >= 100) return `${Math.round(tps)} tok/s`;
  return `${tps.toFixed(1)} tok/s`;
}

export function formatCount(n: number | null | undefined, one: string, many: string): string {
  if (!isNum(n)) return '–';
  const v = Math.round(n);
  return `${v.toLocaleString('en-US')} ${v === 1 ? one : many}`;
}

export interface Figure {
  key: 'ttft' | 'rate' | 'tokens' | 'cached';
  label: string;
  value: string;
  title: string;
}

/** Prompt tokens reused from the KV cache: `cached_tokens` counts both tiers and
 * `cached_tokens_redis` the part restored from the Redis tier, so a turn served from Redis
 * never reads as "0 cached". */
function formatCached(s: Figures): { value: string; title: string } {
  const title = 'Prompt tokens reused from the KV cache';
  if (!isNum(s.cached_tokens)) return { value: '–', title };
  const total = Math.max(0, s.cached_tokens);
  const redis = isNum(s.cached_tokens_redis) ? Math.min(total, Math.max(0, s.cached_tokens_redis)) : 0;
  const memory = total - redis;
  const share = isNum(s.prompt_tokens) && s.prompt_tokens > 0 ? ` (${Math.round((100 * total) / s.prompt_tokens)}%)` : '';
  if (redis === 0) return { value: `${formatCount(total, 'token', 'tokens')}${share}`, title };
  const n = (v: number) => Math.round(v).toLocaleString('en-US');
  const value =
    memory > 0
      ? `${n(memory)} + ${n(redis)} from Redis${share}`
      : `${formatCount(redis, 'token', 'tokens')} from Redis${share}`;
  return { value, title: `${title}: ${n(memory)} in memory, ${n(redis)} restored from the Redis tier` };
}

/** The figures shown under a reply, in order. Missing values show as "–". */
export function formatFigures(figures: Figures | null | undefined): Figure[] {
  const s = figures || {};
  const cached = formatCached(s);
  return [
    { key: 'ttft', label: 'TTFT', value: formatMs(s.ttft_ms), title: 'Time to first token' },
    { key: 'rate', label: 'Speed', value: formatRate(s.tokens_per_s), title: 'Output tokens per second after the first' },
    { key: 'tokens', label: 'Output', value: formatCount(s.output_tokens, 'token', 'tokens'), title: 'Output tokens' },
    { key: 'cached', label: 'Cached', value: cached.value, title: cached.title },
  ];
}

export function hasFigures(figures: Figures | null | undefined): boolean {
  return !!figures && (isNum(figures.ttft_ms) || isNum(figures.output_tokens) || isNum(figures.tokens_per_s));
}

/** Relative day buckets for the sidebar. */
export function dayBucket(iso: string, now = new Date()): string {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return 'Older';
  const startOfToday = new Date(now.getFullYear(), now.getMonth(), now.getDate()).getTime();
  const t = d.getTime();
  if (t >= startOfToday) return 'Today';
  if (t >= startOfToday - 86400000) return 'Yesterday';
  if (t >= startOfToday - 7 * 86400000) return 'Previous 7 days';
  return 'Older';
}

const SAID_CHARS = 400;

/** What the live region says when a reply ends: its text in brief, without markdown's marks. */
export function announcementOf(m: Message): string {
  const plain = m.text
    .replace(/```[^\n]*\n?/g, ' ')
    .replace(/[*_`#>|~]+/g, ' ')
    .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
    .replace(/\s+/g, ' ')
    .trim();
  const brief = plain.length > SAID_CHARS ? plain.slice(0, SAID_CHARS).replace(/\s+\S*$/, '') + '…' : plain;
  if (m.status === 'error') return `The reply failed. ${m.error || ''} ${brief}`.trim();
  if (m.status === 'stopped') return brief ? `Reply stopped: ${brief}` : 'Reply stopped.';
  return brief ? `Reply: ${brief}` : 'The reply is empty.';
}
