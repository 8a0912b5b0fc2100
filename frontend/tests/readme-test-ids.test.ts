/// <reference types="vite/client" />
import { describe, expect, it } from 'vitest';
import readme from '../README.md?raw';

// Everything that can put a test id on a page: the app's views and the server's templates.
const sources = {
  ...import.meta.glob('../src/**/*.{ts,tsx}', { query: '?raw', import: 'default', eager: true }),
  ...import.meta.glob('../../chatapp/**/templates/**/*.html', { query: '?raw', import: 'default', eager: true }),
} as Record<string, string>;

/** The ids the README's "Test ids" table names, in its first column. */
function documentedIds(): string[] {
  const table = readme.slice(readme.indexOf('## Test ids'), readme.indexOf('\nKeyboard:'));
  const ids = new Set<string>();
  for (const line of table.split('\n')) {
    const first = line.startsWith('| `') ? line.split('|')[1] : '';
    // Attributes named beside an id (`data-role`) are not ids.
    for (const m of first.matchAll(/`([a-z0-9-]+)`/g)) if (!m[1].startsWith('data-')) ids.add(m[1]);
  }
  return [...ids];
}

/** Each `data-testid` the sources set, as a pattern: a template (`${testid}-prompt`)
 * matches whatever its placeholder becomes. */
function pagePatterns(): RegExp[] {
  const out: RegExp[] = [];
  for (const text of Object.values(sources)) {
    for (const m of text.matchAll(/data-testid=(?:"([^"]+)"|\{`([^`]+)`\}|'([^']+)')/g)) {
      const raw = (m[1] ?? m[2] ?? m[3]).replace(/[.*+?^$()|[\]\\]/g, (c) => (c === '$' ? c : `\\${c}`));
      out.push(new RegExp(`^${raw.replace(/\$\{[^}]+\}/g, '[a-z0-9-]+')}$`));
    }
  }
  return out;
}

describe('frontend/README.md', () => {
  it('names only test ids that a page carries', () => {
    const ids = documentedIds();
    expect(ids.length).toBeGreaterThan(100);
    const patterns = pagePatterns();
    expect(ids.filter((id) => !patterns.some((p) => p.test(id)))).toEqual([]);
  });
});
