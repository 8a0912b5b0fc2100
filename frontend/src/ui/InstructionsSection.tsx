import { useEffect, useState } from 'preact/hooks';
import { ApiError, request } from '../api';

/** GET/PUT /api/me/instructions/ (docs/http.md, "Custom instructions"). */
export interface InstructionsJson {
  about: string;
  style: string;
  max_chars: number;
  system_prompt: string;
}

export interface InstructionsPort {
  load(): Promise<InstructionsJson>;
  save(values: { about: string; style: string }): Promise<InstructionsJson>;
}

export const instructionsApi: InstructionsPort = {
  load: () => request<InstructionsJson>('GET', '/api/me/instructions/'),
  save: (values) => request<InstructionsJson>('PUT', '/api/me/instructions/', values),
};

interface Props {
  say(words: string): void;
  /** The instructions changed: new chats now start with them. */
  onSaved?(): void;
  port?: InstructionsPort;
}

/** What the user tells every new chat: about them, and how to answer. */
export function InstructionsSection({ say, onSaved, port = instructionsApi }: Props) {
  const [values, setValues] = useState<{ about: string; style: string } | null>(null);
  const [max, setMax] = useState(1500);
  const [error, setError] = useState('');
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState(false);

  useEffect(() => {
    port.load().then(
      (v) => {
        setValues({ about: v.about, style: v.style });
        setMax(v.max_chars);
      },
      (e: Error) => setError(e.message || 'Could not load your instructions.'),
    );
  }, [port]);

  const save = async (e: Event) => {
    e.preventDefault();
    if (!values) return;
    setBusy(true);
    setError('');
    try {
      await port.save(values);
      setSaved(true);
      say('Custom instructions saved: new chats start with them.');
      onSaved?.();
    } catch (err) {
      setError(err instanceof ApiError || err instanceof Error ? err.message : 'Could not save your instructions.');
    } finally {
      setBusy(false);
    }
  };
  const field = (name: 'about' | 'style') => (e: Event) => {
    setSaved(false);
    setValues({ ...(values ?? { about: '', style: '' }), [name]: (e.target as HTMLTextAreaElement).value });
  };

  return (
    <section class="account-section" aria-labelledby="instructions-title" data-testid="instructions-section">
      <h3 id="instructions-title">Custom instructions</h3>
      <p class="muted small">Each new chat starts with these as its system prompt. A chat's own settings can still change its prompt; chats you already have keep theirs.</p>
      <form class="instructions-form" onSubmit={save} noValidate>
        <label>
          What should the assistant know about you?
          <textarea rows={3} data-testid="instructions-about" maxLength={max} disabled={!values} value={values?.about ?? ''} onInput={field('about')} />
        </label>
        <label>
          How should it answer?
          <textarea rows={3} data-testid="instructions-style" maxLength={max} disabled={!values} value={values?.style ?? ''} onInput={field('style')} />
        </label>
        <div class="dialog-actions">
          <button type="submit" class="btn primary" data-testid="instructions-save" disabled={!values || busy}>Save instructions</button>
          {saved ? <span class="muted small" data-testid="instructions-saved">Saved. New chats start with them.</span> : null}
        </div>
      </form>
      {error ? <p class="form-error" role="alert" data-testid="instructions-error">{error}</p> : null}
    </section>
  );
}
