import type { Settings } from './types';

/** GET /api/chat/limits/ (docs/http.md): what the server accepts in a conversation's settings. */
export interface Range {
  min: number;
  max: number;
  default: number;
  /** The minimum itself is refused (top_p must be more than 0). */
  min_exclusive?: boolean;
}

export interface ChatLimits {
  max_tokens: Range;
  temperature: Range;
  top_p: Range;
  system_prompt: { max_chars: number; default: string };
  message: { max_chars: number; max_frame_bytes: number };
  /** The model's context window in tokens; null while the engine is not up. */
  context_tokens: number | null;
  /** Documents: the largest file, and how many go with one message. */
  attachments?: { max_bytes: number; per_message: number };
}

/** Used until the server's answer arrives; the same values as the server's defaults. */
export const FALLBACK_LIMITS: ChatLimits = {
  max_tokens: { min: 1, max: 2048, default: 512 },
  temperature: { min: 0, max: 2, default: 0.7 },
  top_p: { min: 0, max: 1, default: 0.95, min_exclusive: true },
  system_prompt: { max_chars: 32000, default: '' },
  message: { max_chars: 32000, max_frame_bytes: 262144 },
  context_tokens: null,
};

export const num = (x: number): string => x.toLocaleString('en-US', { maximumFractionDigits: 2 });

export type Field = 'temperature' | 'top_p' | 'max_tokens' | 'system_prompt';

const LABEL: Record<Field, string> = {
  temperature: 'Temperature',
  top_p: 'Top-p',
  max_tokens: 'Max tokens',
  system_prompt: 'The system prompt',
};

/** The range of a field as shown next to it, e.g. "1–2,048". */
export function rangeText(r: Range): string {
  return `${num(r.min)}–${num(r.max)}`;
}

/** Why `raw` (what is typed in the field) is not acceptable, in words; '' when it is. */
export function fieldError(field: Exclude<Field, 'system_prompt'>, raw: string, limits: ChatLimits): string {
  const r = limits[field];
  const label = LABEL[field];
  const text = raw.trim();
  if (!text) return `${label} is required.`;
  const v = Number(text);
  if (!Number.isFinite(v)) return `${label} must be a number.`;
  if (field === 'max_tokens' && !Number.isInteger(v)) return `${label} must be a whole number.`;
  const low = r.min_exclusive ? v <= r.min : v < r.min;
  if (low || v > r.max) {
    return r.min_exclusive
      ? `${label} must be more than ${num(r.min)} and at most ${num(r.max)}.`
      : `${label} must be between ${num(r.min)} and ${num(r.max)}.`;
  }
  return '';
}

export interface DialogValues {
  system_prompt: string;
  temperature: string;
  top_p: string;
  max_tokens: string;
  json_mode: boolean;
}

/** Every field's error (only fields with one), and the settings to save when there is none. */
export function validateSettings(
  values: DialogValues,
  limits: ChatLimits,
): { errors: Partial<Record<Field, string>>; settings?: Settings } {
  const errors: Partial<Record<Field, string>> = {};
  for (const f of ['temperature', 'top_p', 'max_tokens'] as const) {
    const e = fieldError(f, values[f], limits);
    if (e) errors[f] = e;
  }
  const maxChars = limits.system_prompt.max_chars;
  if (values.system_prompt.length > maxChars) {
    errors.system_prompt = `The system prompt is longer than ${num(maxChars)} characters.`;
  }
  if (Object.keys(errors).length) return { errors };
  return {
    errors,
    settings: {
      system_prompt: values.system_prompt,
      temperature: Number(values.temperature),
      top_p: Number(values.top_p),
      max_tokens: Number(values.max_tokens),
      json_mode: values.json_mode,
    },
  };
}

/**
 * The settings with every value the server would refuse left out, so a send never fails
 * on them (the server then uses its default for that value). Settings saved before the
 * limits were known, or kept while a limit was lowered, go through here before sending.
 */
export function withinLimits(s: Settings | undefined, limits: ChatLimits): Settings | undefined {
  if (!s) return s;
  const out: Settings = { ...s };
  if (out.temperature != null && fieldError('temperature', String(out.temperature), limits)) delete out.temperature;
  if (out.top_p != null && fieldError('top_p', String(out.top_p), limits)) delete out.top_p;
  if (out.max_tokens != null && fieldError('max_tokens', String(out.max_tokens), limits)) delete out.max_tokens;
  if (out.system_prompt != null && out.system_prompt.length > limits.system_prompt.max_chars) delete out.system_prompt;
  return Object.keys(out).length ? out : undefined;
}
