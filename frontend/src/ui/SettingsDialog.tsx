import { useEffect, useRef, useState } from 'preact/hooks';
import { FALLBACK_LIMITS, num, rangeText, validateSettings, type DialogValues, type Field } from '../limits';
import type { Settings } from '../types';
import { useChat } from './hooks';
import { useModal } from './modal';

export function SettingsDialog({ onClose }: { onClose(): void }) {
  const { conversations } = useChat();
  const currentId = conversations.currentId.value;
  const conv = conversations.conversation(currentId);
  // Right after a page load the conversation may not have arrived yet: the form waits for
  // its settings (showing defaults instead would save them over the real ones).
  if (currentId != null && !conv) return <SettingsLoading onClose={onClose} />;
  return <SettingsForm currentId={currentId} initial={(currentId != null ? conv?.settings : conversations.draftSettings.value) || {}} onClose={onClose} />;
}

function SettingsLoading({ onClose }: { onClose(): void }) {
  const modal = useModal(onClose);
  return (
    <div class="overlay" onMouseDown={(e) => e.target === e.currentTarget && onClose()}>
      <div class="dialog" role="dialog" aria-modal="true" aria-labelledby="settings-title" data-testid="settings-dialog" tabIndex={-1} {...modal}>
        <h2 id="settings-title">Conversation settings</h2>
        <p class="muted" data-testid="settings-loading">Loading this conversation’s settings…</p>
        <div class="dialog-actions">
          <span class="spacer" />
          <button type="button" class="btn" data-testid="settings-cancel" onClick={onClose}>Cancel</button>
        </div>
      </div>
    </div>
  );
}

function SettingsForm({ currentId, initial, onClose }: { currentId: number | null; initial: Settings; onClose(): void }) {
  const { conversations, server, ui } = useChat();
  const engine = server.engine.value;
  // The server's limits (GET /api/chat/limits/); the built-in copy only until they arrive.
  const limits = server.limits.value ?? FALLBACK_LIMITS;
  // This conversation's model; the limits' context window is the default model's.
  const model = conversations.modelOf(currentId, server.defaultModel.value) ?? engine?.model;
  const isDefault = !!model && model === (server.defaultModel.value || engine?.model);
  const context = (model ? server.contextOf(model) : null) ?? (isDefault ? limits.context_tokens ?? engine?.max_model_len ?? null : null);
  const [values, setValues] = useState<DialogValues>(() => ({
    system_prompt: initial.system_prompt ?? limits.system_prompt.default,
    temperature: String(initial.temperature ?? limits.temperature.default),
    top_p: String(initial.top_p ?? limits.top_p.default),
    max_tokens: String(initial.max_tokens ?? limits.max_tokens.default),
    json_mode: initial.json_mode ?? false,
  }));
  const [figures, setFigures] = useState(() => ui.showFigures.value);
  const [error, setError] = useState('');
  const [saving, setSaving] = useState(false);
  const first = useRef<HTMLTextAreaElement>(null);
  const modal = useModal<HTMLFormElement>(onClose);

  useEffect(() => {
    if (!engine) server.loadEngine();
    if (!server.limits.value) server.loadLimits();
    first.current?.focus();
  }, []);

  const { errors, settings } = validateSettings(values, limits);
  const set = (field: Exclude<keyof DialogValues, 'json_mode'>) => (e: Event) => {
    const v = (e.target as HTMLInputElement | HTMLTextAreaElement).value;
    setValues((old) => ({ ...old, [field]: v }));
    setError('');
  };

  const save = async (e: Event) => {
    e.preventDefault();
    // Out of range: nothing is saved; the fields say what to fix, and so does the summary.
    if (!settings) return setError(Object.values(errors).join(' '));
    ui.setShowFigures(figures);
    setSaving(true);
    const r = await conversations.saveSettings(currentId, settings);
    setSaving(false);
    if (r.ok) onClose();
    else setError(r.error || 'Could not save the settings.');
  };

  const fieldError = (field: Field) =>
    errors[field] ? (
      <span class="field-error" id={`settings-${field}-error`} data-testid={`settings-${field.replace('_', '-')}-error`}>
        {errors[field]}
      </span>
    ) : null;
  const invalid = (field: Field) =>
    errors[field] ? { 'aria-invalid': 'true' as const, 'aria-describedby': `settings-${field}-error` } : {};

  return (
    <div class="overlay" onMouseDown={(e) => e.target === e.currentTarget && onClose()}>
      <form class="dialog" role="dialog" aria-modal="true" aria-labelledby="settings-title" data-testid="settings-dialog" tabIndex={-1} {...modal} noValidate onSubmit={save}>
        <h2 id="settings-title">Conversation settings</h2>
        {currentId == null ? <p class="muted small">These apply to the new chat you are about to start.</p> : null}
        <label>
          System prompt
          <textarea ref={first} rows={4} data-testid="settings-system-prompt" value={values.system_prompt} placeholder="You are a helpful assistant." onInput={set('system_prompt')} {...invalid('system_prompt')} />
          {fieldError('system_prompt')}
        </label>
        <div class="row">
          <label>
            <span>Temperature <span class="muted">({rangeText(limits.temperature)})</span></span>
            <input type="number" step="0.05" min={limits.temperature.min} max={limits.temperature.max} data-testid="settings-temperature" value={values.temperature} onInput={set('temperature')} {...invalid('temperature')} />
            {fieldError('temperature')}
          </label>
          <label>
            <span>Top-p <span class="muted">({rangeText(limits.top_p)})</span></span>
            <input type="number" step="0.01" min="0.01" max={limits.top_p.max} data-testid="settings-top-p" value={values.top_p} onInput={set('top_p')} {...invalid('top_p')} />
            {fieldError('top_p')}
          </label>
          <label>
            <span>Max tokens <span class="muted" data-testid="settings-max-tokens-range">({rangeText(limits.max_tokens)})</span></span>
            <input type="number" step="1" min={limits.max_tokens.min} max={limits.max_tokens.max} data-testid="settings-max-tokens" value={values.max_tokens} onInput={set('max_tokens')} {...invalid('max_tokens')} />
            {fieldError('max_tokens')}
          </label>
        </div>
        <label class="check">
          <input
            type="checkbox"
            data-testid="settings-json-mode"
            checked={values.json_mode}
            onChange={(e) => {
              const on = (e.target as HTMLInputElement).checked;
              setValues((old) => ({ ...old, json_mode: on }));
              setError('');
            }}
          />
          <span>
            JSON mode <span class="muted">(every reply in this chat is a JSON object; say in your message what it should hold)</span>
          </span>
        </label>
        <label class="check">
          <input type="checkbox" data-testid="settings-show-figures" checked={figures} onChange={(e) => setFigures((e.target as HTMLInputElement).checked)} />
          <span>
            Show figures under each reply <span class="muted">(time to first token, speed, tokens, cached tokens; in every conversation, in this browser)</span>
          </span>
        </label>
        {model ? (
          <p class="muted small" data-testid="settings-model">
            Model: {model}
            {context ? ` · context ${num(context)} tokens` : ''}
            <span class="muted"> (change it at the top of the chat)</span>
          </p>
        ) : null}
        {error ? <p class="form-error" role="alert" data-testid="settings-error">{error}</p> : null}
        <div class="dialog-actions">
          <button
            type="button"
            class="btn"
            data-testid="settings-reset"
            onClick={() => {
              setValues({
                system_prompt: limits.system_prompt.default,
                temperature: String(limits.temperature.default),
                top_p: String(limits.top_p.default),
                max_tokens: String(limits.max_tokens.default),
                json_mode: false,
              });
              setError('');
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
