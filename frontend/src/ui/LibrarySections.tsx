import { useEffect, useState } from 'preact/hooks';
import type { ApiError } from '../api';
import { exportAll, exportsApi, type ExportFormat, type ExportJob, type ExportsPort } from '../exports';
import type { SavedPrompts } from '../prompts';

/** The saved prompts: add one (a name and its text), delete one. `/name` in the composer uses it. */
export function PromptsSection({ prompts, say }: { prompts: SavedPrompts; say(words: string): void }) {
  const list = prompts.list.value;
  const [loaded, setLoaded] = useState(false);
  const [name, setName] = useState('');
  const [text, setText] = useState('');
  const [error, setError] = useState('');
  const [busy, setBusy] = useState(false);
  useEffect(() => {
    prompts.load(true).then(
      () => setLoaded(true),
      (e) => setError((e as Error).message),
    );
  }, [prompts]);

  const add = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    try {
      const p = await prompts.create(name, text);
      setName('');
      setText('');
      setError('');
      say(`Prompt /${p.name} saved.`);
    } catch (err) {
      setError((err as ApiError).message);
    } finally {
      setBusy(false);
    }
  };
  const remove = async (id: number, named: string) => {
    try {
      await prompts.remove(id);
      say(`Prompt /${named} deleted.`);
    } catch (err) {
      setError((err as ApiError).message);
    }
  };

  return (
    <section class="account-section" aria-labelledby="prompts-title" data-testid="prompts-section">
      <h3 id="prompts-title">Saved prompts</h3>
      <p class="muted small">
        Type <kbd>/</kbd> and its name at the start of a message (or find it with <kbd>Ctrl+K</kbd>) to put its text in the box.
      </p>
      <form class="prompt-form" onSubmit={add} noValidate>
        <label>
          Name
          <input type="text" data-testid="prompt-name" value={name} maxLength={40} placeholder="e.g. summarize" onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </label>
        <label>
          Text
          <textarea data-testid="prompt-text" rows={3} value={text} placeholder="Summarize the text below in three bullet points:" onInput={(e) => setText((e.target as HTMLTextAreaElement).value)} />
        </label>
        <button type="submit" class="btn primary" data-testid="prompt-save" disabled={busy || !name.trim() || !text.trim()}>Save prompt</button>
      </form>
      {error ? <p class="form-error" role="alert" data-testid="prompt-error">{error}</p> : null}
      {!loaded && !error ? (
        <p class="muted small">Loading…</p>
      ) : list.length ? (
        <ul class="prompt-list" data-testid="prompt-list">
          {list.map((p) => (
            <li key={p.id} data-testid="prompt-row">
              <code>/{p.name}</code>
              <span class="prompt-text muted">{p.text}</span>
              <button type="button" class="btn small danger" data-testid="prompt-delete" aria-label={`Delete prompt /${p.name}`} onClick={() => void remove(p.id, p.name)}>Delete</button>
            </li>
          ))}
        </ul>
      ) : loaded ? (
        <p class="muted small">No saved prompts yet.</p>
      ) : null}
    </section>
  );
}

const FORMAT_WORDS: Record<ExportFormat, string> = {
  md: 'Markdown (a zip, one file per conversation)',
  json: 'JSON (a zip of one file; it can be imported back)',
  txt: 'Plain text (a zip, one file per conversation)',
};

/** Export every saved conversation (temporary chats are not) as a zip, made on the server. */
export function ExportSection({ say, api = exportsApi }: { say(words: string): void; api?: ExportsPort }) {
  const [format, setFormat] = useState<ExportFormat>('md');
  const [job, setJob] = useState<ExportJob | null>(null);
  const [error, setError] = useState('');
  const running = job != null && (job.status === 'queued' || job.status === 'running');

  const start = async () => {
    setError('');
    say('Preparing the export…');
    try {
      const end = await exportAll(format, setJob, api);
      if (end.status === 'done') say('The export is ready to download.');
      else setError(end.status === 'failed' ? 'The export failed. Try again later.' : 'The export did not finish. Try again later.');
    } catch (err) {
      setJob(null);
      setError((err as ApiError).message);
    }
  };

  return (
    <section class="account-section" aria-labelledby="export-title" data-testid="export-section">
      <h3 id="export-title">Export all conversations</h3>
      <div class="export-row">
        <label>
          Format
          <select data-testid="export-format" value={format} onChange={(e) => setFormat((e.target as HTMLSelectElement).value as ExportFormat)}>
            {(Object.keys(FORMAT_WORDS) as ExportFormat[]).map((f) => (
              <option key={f} value={f}>{FORMAT_WORDS[f]}</option>
            ))}
          </select>
        </label>
        <button type="button" class="btn primary" data-testid="export-all" disabled={running} onClick={() => void start()}>
          {running ? 'Preparing…' : 'Export'}
        </button>
      </div>
      {job?.status === 'done' && job.download ? (
        <p data-testid="export-ready">
          Ready: <a href={job.download} download data-testid="export-download">download the {job.format.toUpperCase()} export</a>
        </p>
      ) : null}
      {error ? <p class="form-error" role="alert" data-testid="export-error">{error}</p> : null}
    </section>
  );
}
