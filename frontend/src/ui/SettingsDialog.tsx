import { useEffect, useRef, useState } from 'preact/hooks';
import type { Settings } from '../types';
import { useStore, useStoreInstance } from './hooks';

const FALLBACK = { temperature: 0.7, top_p: 0.95, max_tokens: 512 };

export function SettingsDialog({ onClose }: { onClose(): void }) {
  const store = useStoreInstance();
  const currentId = useStore((s) => s.currentId);
  const engine = useStore((s) => s.engine);
  const conv = useStore((s) => s.conversation(s.currentId));
  const draft = useStore((s) => s.draftSettings);
  const defaults = { ...FALLBACK, ...(engine?.defaults || {}) };
  const initial: Settings = (currentId != null ? conv?.settings : draft) || {};
  const [system, setSystem] = useState(initial.system_prompt ?? '');
  const [temperature, setTemperature] = useState(String(initial.temperature ?? defaults.temperature));
  const [topP, setTopP] = useState(String(initial.top_p ?? defaults.top_p));
  const [maxTokens, setMaxTokens] = useState(String(initial.max_tokens ?? defaults.max_tokens));
  const [error, setError] = useState('');
  const [saving, setSaving] = useState(false);
  const first = useRef<HTMLTextAreaElement>(null);

  useEffect(() => {
    if (!engine) store.loadEngine();
    first.current?.focus();
  }, []);

  const maxLimit = engine?.max_model_len || 32768;
  const save = async (e: Event) => {
    e.preventDefault();
    const t = Number(temperature);
    const p = Number(topP);
    const m = Number(maxTokens);
    if (!(t >= 0 && t <= 2)) return setError('Temperature must be between 0 and 2.');
    if (!(p > 0 && p <= 1)) return setError('Top-p must be more than 0 and at most 1.');
    if (!(Number.isInteger(m) && m >= 1 && m <= maxLimit)) return setError(`Max tokens must be a whole number from 1 to ${maxLimit}.`);
    setSaving(true);
    const r = await store.saveSettings(currentId, { system_prompt: system, temperature: t, top_p: p, max_tokens: m });
    setSaving(false);
    if (r.ok) onClose();
    else setError(r.error || 'Could not save the settings.');
  };

  return (
    <div class="overlay" onMouseDown={(e) => e.target === e.currentTarget && onClose()}>
      <form class="dialog" role="dialog" aria-modal="true" aria-labelledby="settings-title" data-testid="settings-dialog" noValidate onSubmit={save}>
        <h2 id="settings-title">Conversation settings</h2>
        {currentId == null ? <p class="muted small">These apply to the new chat you are about to start.</p> : null}
        <label>
          System prompt
          <textarea ref={first} rows={4} data-testid="settings-system-prompt" value={system} placeholder="You are a helpful assistant." onInput={(e) => setSystem((e.target as HTMLTextAreaElement).value)} />
        </label>
        <div class="row">
          <label>
            <span>Temperature <span class="muted">(0–2)</span></span>
            <input type="number" step="0.05" min="0" max="2" data-testid="settings-temperature" value={temperature} onInput={(e) => setTemperature((e.target as HTMLInputElement).value)} />
          </label>
          <label>
            <span>Top-p <span class="muted">(0–1)</span></span>
            <input type="number" step="0.01" min="0.01" max="1" data-testid="settings-top-p" value={topP} onInput={(e) => setTopP((e.target as HTMLInputElement).value)} />
          </label>
          <label>
            <span>Max tokens <span class="muted">(1–{maxLimit})</span></span>
            <input type="number" step="1" min="1" max={maxLimit} data-testid="settings-max-tokens" value={maxTokens} onInput={(e) => setMaxTokens((e.target as HTMLInputElement).value)} />
          </label>
        </div>
        {engine ? <p class="muted small" data-testid="settings-model">Model: {engine.model} · context {engine.max_model_len} tokens</p> : null}
        {error ? <p class="form-error" role="alert" data-testid="settings-error">{error}</p> : null}
        <div class="dialog-actions">
          <button
            type="button"
            class="btn"
            data-testid="settings-reset"
            onClick={() => {
              setSystem('');
              setTemperature(String(defaults.temperature));
              setTopP(String(defaults.top_p));
              setMaxTokens(String(defaults.max_tokens));
            }}
          >
            Defaults
          </button>
          <span class="spacer" />
          <button type="button" class="btn" data-testid="settings-cancel" onClick={onClose}>Cancel</button>
          <button type="submit" class="btn primary" data-testid="settings-save" disabled={saving}>Save</button>
        </div>
      </form>
    </div>
  );
}
