import type pg from 'pg';

/**
 * Waits until `check` holds, polling every 10 ms for up to 5 s; then throws, naming `what`. For
 * tests that stage a race: a statement waiting on a lock, a backend hit, a record written.
 */
export async function until(what: string, check: () => Promise<boolean> | boolean): Promise<void> {
  for (let i = 0; i < 500; i += 1) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  if (!(await check())) throw new Error(`timed out waiting for ${what}`);
}

/** How many sessions of `watcher`'s database are waiting for a lock now. */
export async function lockWaits(watcher: pg.Client): Promise<number> {
  const { rows } = await watcher.query(`select count(*)::int as n from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'`);
  return rows[0].n as number;
}

/** The sessions of `watcher`'s database that `pid` is blocking now. */
export async function blockedBy(watcher: pg.Client, pid: number): Promise<number[]> {
  const { rows } = await watcher.query(`select pid from pg_stat_activity where datname = current_database() and $1 = any(pg_blocking_pids(pid))`, [pid]);
  return rows.map((row) => row.pid as number);
}
