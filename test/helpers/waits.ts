import { Kysely, sql } from 'kysely';
import type pg from 'pg';

export interface UntilOptions {
  /** How long to wait at most (a bound on the test, not a speed claim); 10 s unless given. */
  timeoutMs?: number;
  /** How long to wait between two checks; 10 ms unless given. */
  intervalMs?: number;
}

/**
 * Waits until `check` holds, polling it; throws, naming `what`, if it still does not after the
 * timeout. For tests that stage a race (a statement waiting on a lock, a backend hit, a record
 * written) or wait for a background round on the real clock.
 */
export async function until(
  what: string,
  check: () => Promise<boolean> | boolean,
  options: UntilOptions = {},
): Promise<void> {
  const { timeoutMs = 10_000, intervalMs = 10 } = options;
  const deadline = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/**
 * How many sessions of the watched database are waiting for a lock now; with `pattern`, only
 * those whose statement matches it (`ilike`). `watcher` is a client or a pool of that database.
 */
export async function lockWaits(watcher: pg.Client | Kysely<any>, pattern = '%'): Promise<number> {
  const waiting = `select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock' and query ilike`;
  if (watcher instanceof Kysely)
    return (await sql<{ n: number }>`${sql.raw(waiting)} ${pattern}`.execute(watcher)).rows[0]!.n;
  return (await watcher.query(`${waiting} $1`, [pattern])).rows[0].n as number;
}

/** The sessions of `watcher`'s database that `pid` is blocking now. */
export async function blockedBy(watcher: pg.Client, pid: number): Promise<number[]> {
  const { rows } = await watcher.query(
    `select pid from pg_stat_activity where datname = current_database() and $1 = any(pg_blocking_pids(pid))`,
    [pid],
  );
  return rows.map((row) => row.pid as number);
}
