import { useRef, useState } from 'preact/hooks';
import { api } from '../api';
import { useChat } from './hooks';

/** Bring conversations in from a ChatGPT export (conversations.json or its zip) or this app's JSON export. */
export function ImportButton({ onNavigate }: { onNavigate: () => void }) {
  const { conversations } = useChat();
  const picker = useRef<HTMLInputElement>(null);
  const [busy, setBusy] = useState(false);
  const [said, setSaid] = useState<{ ok: boolean; text: string } | null>(null);

  const run = async (file: File) => {
    setBusy(true);
    setSaid(null);
    try {
      const answer = await api.importConversations(file);
      const n = answer.imported;
      setSaid({ ok: true, text: `Imported ${n} conversation${n === 1 ? '' : 's'} from ${file.name}.` });
      await conversations.refreshList();
      if (answer.conversations[0]) {
        await conversations.select(answer.conversations[0].id);
        onNavigate();
      }
    } catch (e) {
      const text = (e instanceof Error && e.message) || 'The import failed.';
      setSaid({ ok: false, text });
    } finally {
      setBusy(false);
    }
  };

  return (
    <div class="import">
      <button
        type="button"
        class="icon-btn import-button"
        data-testid="import-button"
        title="Import conversations: a ChatGPT export (conversations.json or its zip) or this app's JSON export"
        disabled={busy}
        onClick={() => picker.current?.click()}
      >
        {busy ? 'Importing…' : 'Import'}
      </button>
      <input
        ref={picker}
        type="file"
        accept=".json,.zip,application/json,application/zip"
        hidden
        data-testid="import-input"
        onChange={(e) => {
          const input = e.target as HTMLInputElement;
          const file = input.files?.[0];
          input.value = '';
          if (file) run(file);
        }}
      />
      {said ? (
        <p class={'import-result' + (said.ok ? '' : ' import-error')} role="status" data-testid="import-result" data-ok={String(said.ok)}>
          {said.text}
        </p>
      ) : null}
    </div>
  );
}
