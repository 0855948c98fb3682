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
  /** Keys of the items a refresh brought that this view had not shown before. */
  fresh: ReadonlySet<string>;
  /** When the listing last answered. */
  refreshedAt: Date | null;
  /** Whether it refreshes on its own while the tab is visible. */
  live: boolean;
  next(): void;
  previous(): void;
  /** Loads the page shown again, in place: what is on screen stays until the answer replaces it. */
  reload(): void;
}

/** How often a live listing asks again: the console is at most this far behind (SPEC §14.1: 5 s). */
export const LIVE_INTERVAL_MS = 4_000;

export interface PagedOptions<T> {
  /** An item's identity, so that rows a refresh brings can be marked new. */
  key?: (item: T) => string;
  /** Refresh on its own every LIVE_INTERVAL_MS while the tab is visible. */
  live?: boolean;
}

/**
 * One page of a cursor-paginated listing at a time. The cursors of the pages already seen are
 * kept, so "Previous page" goes back without the API needing backward cursors. A refresh replaces
 * the items without emptying the list first, so that keyed rows — and what is typed in them — stay.
 */
export function usePaged<T>(
  load: (cursor: string | undefined) => Promise<Outcome<Page<T>>>,
  deps: unknown[],
  options: PagedOptions<T> = {},
): Paged<T> {
  const [cursors, setCursors] = useState<Array<string | undefined>>([undefined]);
  const [nextCursor, setNextCursor] = useState<string | null>(null);
  const [items, setItems] = useState<T[]>([]);
  const [loading, setLoading] = useState(true);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const [round, setRound] = useState(0);
  const [fresh, setFresh] = useState<ReadonlySet<string>>(new Set());
  const [refreshedAt, setRefreshedAt] = useState<Date | null>(null);
  const latest = useRef(0);
  const refreshing = useRef(false);
  const seen = useRef(new Set<string>());

  // A change of filter starts again from the first page (the first render loads it already).
  const mounted = useRef(false);
  useEffect(() => {
    if (mounted.current) {
      seen.current = new Set();
      setFresh(new Set());
      setCursors([undefined]);
    }
    mounted.current = true;
  }, deps);

  const cursor = cursors[cursors.length - 1];
  useEffect(() => {
    const ticket = ++latest.current;
    // Only a refresh of the page shown marks rows new; another page's rows are merely unseen.
    const isRefresh = refreshing.current;
    refreshing.current = false;
    if (!isRefresh) setLoading(true);
    void load(cursor).then((outcome) => {
      if (ticket !== latest.current) return;
      setLoading(false);
      setRefreshedAt(new Date());
      if (outcome.ok) {
        const arrived = options.key ? outcome.data.items.map(options.key).filter((k) => !seen.current.has(k)) : [];
        for (const key of arrived) seen.current.add(key);
        if (isRefresh && arrived.length > 0) setFresh((before) => new Set([...before, ...arrived]));
        setItems(outcome.data.items);
        setNextCursor(outcome.data.next_cursor);
        setRefusal(null);
      } else {
        // A refresh that fails keeps what is shown, under the refusal.
        if (!isRefresh) {
          setItems([]);
          setNextCursor(null);
        }
        setRefusal(outcome.refusal);
      }
    });
  }, [cursors, round]);

  const reload = useCallback(() => {
    refreshing.current = true;
    setRound((n) => n + 1);
  }, []);
  useWhileVisible(reload, options.live ? LIVE_INTERVAL_MS : null);

  return {
    loading,
    refusal,
    items,
    hasNext: nextCursor !== null,
    hasPrevious: cursors.length > 1,
    pageNumber: cursors.length,
    fresh,
    refreshedAt,
    live: options.live === true,
    next: () => nextCursor !== null && setCursors([...cursors, nextCursor]),
    previous: () => cursors.length > 1 && setCursors(cursors.slice(0, -1)),
    reload,
  };
}

/**
 * Calls `tick` every `intervalMs` while the tab is visible, and once as it becomes visible again:
 * a hidden console asks nothing of the gateway.
 */
export function useWhileVisible(tick: () => void, intervalMs: number | null): void {
  useEffect(() => {
    if (intervalMs === null) return;
    let timer: ReturnType<typeof setInterval> | undefined;
    const stop = () => {
      if (timer !== undefined) clearInterval(timer);
      timer = undefined;
    };
    const start = () => {
      stop();
      if (document.visibilityState === 'visible') timer = setInterval(tick, intervalMs);
    };
    const onVisibility = () => {
      if (document.visibilityState === 'visible') tick();
      start();
    };
    start();
    document.addEventListener('visibilitychange', onVisibility);
    return () => {
      stop();
      document.removeEventListener('visibilitychange', onVisibility);
    };
  }, [tick, intervalMs]);
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
