import { createContext } from 'preact';
import { useContext, useEffect, useReducer, useRef } from 'preact/hooks';
import type { Store } from '../store';

export const StoreContext = createContext<Store>(null as unknown as Store);

export function useStoreInstance(): Store {
  return useContext(StoreContext);
}

/** Re-render when the selected value changes (compared with Object.is). */
export function useStore<T>(select: (s: Store) => T): T {
  const store = useContext(StoreContext);
  const [, force] = useReducer((x: number) => x + 1, 0);
  const selRef = useRef(select);
  selRef.current = select;
  const value = select(store);
  const valRef = useRef(value);
  valRef.current = value;
  useEffect(() => {
    const check = () => {
      if (!Object.is(selRef.current(store), valRef.current)) force(0);
    };
    const off = store.subscribe(check);
    check(); // a change between render and subscribe
    return off;
  }, [store]);
  return value;
}
