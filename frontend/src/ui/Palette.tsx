import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'preact/hooks';
import { api } from '../api';
import type { Conversation } from '../types';
import { useChat } from './hooks';
import { useModal } from './modal';

export interface Command {
  id: string;
  /** What the list shows. */
  label: string;
  /** A second, quieter line (a conversation's folder, a prompt's start). */
  hint?: string;
  group: 'Actions' | 'Models' | 'Prompts' | 'Conversations';
  /** Found by the server's search of the words: shown whatever its title says. */
  found?: boolean;
  run(): void;
}

interface Props {
  onClose(): void;
  /** The palette's own actions, besides conversations, models and prompts. */
  actions: Command[];
  /** Put a saved prompt's text in the composer. */
  onInsert(text: string): void;
  /** For tests: the search of conversations' words (the server's by default). */
  search?: (q: string) => Promise<{ conversations: Conversation[] }>;
}

/** Whether every word of the query is in the text (any order, any case). */
export function fits(query: string, text: string): boolean {
  const t = text.toLowerCase();
  return query
    .toLowerCase()
    .split(/\s+/)
    .filter(Boolean)
    .every((w) => t.includes(w));
}

/**
 * The Ctrl+K command palette: type to find an action, a model to switch to, a saved prompt
 * to insert or a conversation (by title here, by its words on the server); arrows move,
 * Enter runs, Escape closes.
 */
export function Palette({ onClose, actions, onInsert, search = (q) => api.list(q) }: Props) {
  const { conversations, server, prompts } = useChat();
  const [q, setQ] = useState('');
  const [found, setFound] = useState<Conversation[] | null>(null);
  const [active, setActive] = useState(0);
  const modal = useModal(onClose);
  const input = useRef<HTMLInputElement>(null);
  const currentId = conversations.currentId.value;

  // Focused in the render's own task (useModal's note): "Ctrl+K, type, Enter" at typing
  // speed must not leave the words, and the Enter, to the composer.
  useLayoutEffect(() => input.current?.focus(), []);
  useEffect(() => {
    prompts.load().catch(() => undefined);
  }, []);

  // The conversations' words are searched on the server, once typing pauses.
  useEffect(() => {
    const words = q.trim();
    if (words.length < 2) {
      setFound(null);
      return;
    }
    let live = true;
    const t = setTimeout(() => {
      search(words).then(
        (r) => live && setFound(r.conversations),
        () => undefined,
      );
    }, 200);
    return () => {
      live = false;
      clearTimeout(t);
    };
  }, [q]);

  const models = server.models.value?.models ?? [];
  const current = conversations.modelOf(currentId, server.defaultModel.value);
  const commands = useMemo(() => {
    const all: Command[] = [...actions];
    if (models.length > 1) {
      for (const m of models) {
        if (m.id === current) continue;
        all.push({ id: 'model:' + m.id, label: `Switch model to ${m.id}`, group: 'Models', run: () => void conversations.setModel(currentId, m.id) });
      }
    }
    for (const p of prompts.list.value) {
      all.push({ id: 'prompt:' + p.id, label: '/' + p.name, hint: p.text.slice(0, 80), group: 'Prompts', run: () => onInsert(p.text) });
    }
    const seen = new Set<number>();
    const convs = [...conversations.list.value, ...(found ?? [])].filter((c) => !seen.has(c.id) && !!seen.add(c.id));
    for (const c of convs) {
      const byWords = !!found?.some((f) => f.id === c.id);
      all.push({ id: 'conv:' + c.id, label: c.title || 'New chat', hint: c.folder || undefined, group: 'Conversations', found: byWords, run: () => void conversations.select(c.id) });
    }
    const words = q.trim();
    return all
      .filter((c) => !words || c.found || fits(words, c.label + ' ' + (c.group === 'Prompts' ? c.hint || '' : '')))
      .slice(0, 60);
  }, [q, found, actions, models, current, prompts.list.value, conversations.list.value]);

  useEffect(() => setActive(0), [q]);
  const run = (c: Command | undefined) => {
    if (!c) return;
    onClose();
    c.run();
  };

  let lastGroup = '';
  return (
    <div class="overlay palette-overlay" onMouseDown={(e) => e.target === e.currentTarget && onClose()}>
      <div class="dialog palette" role="dialog" aria-modal="true" aria-label="Command palette" data-testid="palette" tabIndex={-1} {...modal}>
        <input
          ref={input}
          type="text"
          class="palette-input"
          data-testid="palette-input"
          role="combobox"
          aria-expanded="true"
          aria-controls="palette-list"
          aria-activedescendant={commands[active] ? 'palette-' + active : undefined}
          aria-label="Search conversations and commands"
          placeholder="Search conversations, run a command…"
          value={q}
          onInput={(e) => setQ((e.target as HTMLInputElement).value)}
          onKeyDown={(e) => {
            if (e.key === 'ArrowDown') {
              e.preventDefault();
              setActive((a) => Math.min(commands.length - 1, a + 1));
            } else if (e.key === 'ArrowUp') {
              e.preventDefault();
              setActive((a) => Math.max(0, a - 1));
            } else if (e.key === 'Enter') {
              e.preventDefault();
              run(commands[active]);
            }
          }}
        />
        <ul class="palette-list" id="palette-list" role="listbox" aria-label="Results" data-testid="palette-list">
          {commands.map((c, i) => {
            const head = c.group !== lastGroup ? (lastGroup = c.group) : null;
            return (
              <li
                key={c.id}
                id={'palette-' + i}
                role="option"
                aria-selected={i === active}
                class={'palette-item' + (i === active ? ' active' : '')}
                data-testid="palette-item"
                data-command={c.id}
                onMouseMove={() => setActive(i)}
                onClick={() => run(c)}
              >
                {head ? <span class="palette-group" aria-hidden="true">{head}</span> : null}
                <span class="palette-label">{c.label}</span>
                {c.hint ? <span class="palette-hint">{c.hint}</span> : null}
              </li>
            );
          })}
          {!commands.length ? <li class="palette-empty muted" role="presentation">Nothing found.</li> : null}
        </ul>
      </div>
    </div>
  );
}

export const SHORTCUTS: [string, string][] = [
  ['Ctrl+K', 'Search conversations and commands'],
  ['Ctrl+Shift+O', 'New chat'],
  ['/', 'Saved prompts (at the start of a message)'],
  ['Enter', 'Send'],
  ['Shift+Enter', 'New line'],
  ['Esc', 'Stop the reply, close a dialog'],
  ['?', 'These shortcuts'],
];

/** The keyboard shortcuts (`?` outside a text box). */
export function ShortcutsDialog({ onClose }: { onClose(): void }) {
  const modal = useModal(onClose);
  return (
    <div class="overlay" onMouseDown={(e) => e.target === e.currentTarget && onClose()}>
      <div class="dialog shortcuts-dialog" role="dialog" aria-modal="true" aria-labelledby="shortcuts-title" data-testid="shortcuts-dialog" tabIndex={-1} {...modal}>
        <h2 id="shortcuts-title">Keyboard shortcuts</h2>
        <dl class="shortcuts">
          {SHORTCUTS.map(([keys, what]) => (
            <div key={keys}>
              <dt><kbd>{keys}</kbd></dt>
              <dd>{what}</dd>
            </div>
          ))}
        </dl>
        <div class="dialog-actions">
          <span class="spacer" />
          <button type="button" class="btn" data-testid="shortcuts-close" onClick={onClose}>Close</button>
        </div>
      </div>
    </div>
  );
}
