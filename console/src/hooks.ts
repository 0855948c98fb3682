import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import type { Outcome, Refusal } from './api.js';

export interface Page<T> {
  items: T[];
  next_cursor: string | null;
}

export interface Paged<T> {
  loading: boolean;
  refusal: Refusal | null;
  items: T[];
  hasNext: boolean;
  hasPrevious: boolean;
  pageNumber: number;
  next(): void;
  previous(): void;
  reload(): void;
}

/**
 * One page of a cursor-paginated listing at a time. The cursors of the pages already seen are
 * kept, so "Previous page" goes back without the API needing backward cursors.
 */
export function usePaged<T>(
  load: (cursor: string | undefined) => Promise<Outcome<Page<T>>>,
  deps: unknown[],
): Paged<T> {
  const [cursors, setCursors] = useState<Array<string | undefined>>([undefined]);
  const [nextCursor, setNextCursor] = useState<string | null>(null);
  const [items, setItems] = useState<T[]>([]);
  const [loading, setLoading] = useState(true);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [round, setRound] = useState(0);
  const latest = useRef(0);

  // A change of filter starts again from the first page (the first render loads it already).
  const mounted = useRef(false);
  useEffect(() => {
    if (mounted.current) setCursors([undefined]);
    mounted.current = true;
  }, deps);

  const cursor = cursors[cursors.length - 1];
  useEffect(() => {
    const ticket = ++latest.current;
    setLoading(true);
    void load(cursor).then((outcome) => {
      if (ticket !== latest.current) return;
      setLoading(false);
      if (outcome.ok) {
        setItems(outcome.data.items);
        setNextCursor(outcome.data.next_cursor);
        setRefusal(null);
      } else {
        setItems([]);
        setNextCursor(null);
        setRefusal(outcome.refusal);
      }
    });
  }, [cursors, round]);

  return {
    loading,
    refusal,
    items,
    hasNext: nextCursor !== null,
    hasPrevious: cursors.length > 1,
    pageNumber: cursors.length,
    next: () => nextCursor !== null && setCursors([...cursors, nextCursor]),
    previous: () => cursors.length > 1 && setCursors(cursors.slice(0, -1)),
    reload: useCallback(() => setRound((n) => n + 1), []),
  };
}

/** The state of one action (a form's submission): busy, and the last refusal or result. */
export function useAction<T>() {
  const [busy, setBusy] = useState(false);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [result, setResult] = useState<T | null>(null);
  const run = async (call: () => Promise<Outcome<T>>): Promise<Outcome<T>> => {
    setBusy(true);
    setRefusal(null);
    const outcome = await call();
    setBusy(false);
    if (outcome.ok) setResult(outcome.data);
    else setRefusal(outcome.refusal);
    return outcome;
  };
  return { busy, refusal, result, run, setResult };
}

/**
 * The URL's fragment, kept current. It is read again once subscribed: effects run after paint, and
 * a link followed in between would otherwise be missed.
 */
export function useHash(): string {
  const [hash, setHash] = useState(() => location.hash);
  useEffect(() => {
    const onChange = () => setHash(location.hash);
    addEventListener('hashchange', onChange);
    onChange();
    return () => removeEventListener('hashchange', onChange);
  }, []);
  return hash;
}
