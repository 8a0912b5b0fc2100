export type Theme = 'light' | 'dark';
const KEY = 'chat.theme';

export function storedTheme(): Theme | null {
  try {
    const v = localStorage.getItem(KEY);
    return v === 'light' || v === 'dark' ? v : null;
  } catch {
    return null;
  }
}

export function systemTheme(): Theme {
  return typeof matchMedia === 'function' && matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light';
}

export function effectiveTheme(): Theme {
  return storedTheme() ?? systemTheme();
}

export function applyTheme(t: Theme = effectiveTheme()): Theme {
  document.documentElement.dataset.theme = t;
  document.documentElement.style.colorScheme = t;
  return t;
}

export function setTheme(t: Theme | null): Theme {
  try {
    if (t) localStorage.setItem(KEY, t);
    else localStorage.removeItem(KEY);
  } catch {
    /* private mode */
  }
  return applyTheme();
}

/** Follow the system while the person has not chosen. */
export function watchSystemTheme(onChange: (t: Theme) => void): () => void {
  if (typeof matchMedia !== 'function') return () => undefined;
  const mq = matchMedia('(prefers-color-scheme: dark)');
  const fn = () => {
    if (!storedTheme()) onChange(applyTheme());
  };
  mq.addEventListener?.('change', fn);
  return () => mq.removeEventListener?.('change', fn);
}
