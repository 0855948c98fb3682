import type { Kysely } from 'kysely';
import type { Logger } from 'pino';
import { Counter, type Registry } from 'prom-client';
import { BackgroundTask } from '../db/background-task.js';
import type { DB } from '../db/schema.js';
import { deleteFinishedRunTrees, deleteLapsedReplicas, lockFinishedRoots, NO_DELETIONS, takeRetentionTurn, type RetentionCounts, type RootPosition } from './retention-repository.js';

/** Root runs looked at per transaction: each batch holds its locks for a few milliseconds. */
const BATCH_SIZE = 100;

const DAY_MS = 86_400_000;

/** What the sweeper is built from, by the composition root. */
export interface RetentionSweeperOptions {
  db: Kysely<DB>;
  now: () => Date;
  /** Finished run trees are deleted this many days after they last changed (`TOOLGATE_RETENTION_DAYS`). */
  retentionDays: number;
  intervalMs: number;
  logger: Logger;
  registry: Registry;
  /** Root runs looked at per transaction (default 100). */
  batchSize?: number;
}

/** What one sweep deleted; `skipped` when another replica was sweeping. */
export interface RetentionSweep extends RetentionCounts {
  replicas: number;
  skipped: boolean;
}

/**
 * Keeps the per-call tables from growing without bound: a run tree (a root run and its sub-runs)
 * whose every run finished more than `retentionDays` ago is deleted with the rows kept only for
 * it — approvals, hand-offs, grant uses, closed budget reservations, run-total counters — in
 * bounded batches, one short transaction each. Replicas whose lease lapsed as long ago go too.
 *
 * What is never deleted: the audit log (append-only, and the record of every deleted run's
 * calls), a run not finished or still held by an executor, a tree with any such run, an open
 * reservation, budgets and their counters, grants, kill switches, the registry.
 *
 * Every replica runs one; a batch first takes a transaction-scoped advisory lock, so only one
 * replica deletes at a time and the others skip their round after one statement.
 */
export class RetentionSweeper {
  private readonly task: BackgroundTask;
  private readonly deleted: Counter<'table'>;
  private stopping = false;

  constructor(private readonly options: RetentionSweeperOptions) {
    this.deleted = new Counter({
      name: 'toolgate_retention_deleted_rows_total',
      help: 'Rows the retention sweep deleted, by table (finished runs and their bookkeeping)',
      labelNames: ['table'],
      registers: [options.registry],
    });
    this.task = new BackgroundTask({ name: 'retention sweep', run: () => this.sweep(), intervalMs: () => options.intervalMs, logger: options.logger });
  }

  start(): void {
    this.stopping = false;
    this.task.start();
  }

  /** Stops after the batch in progress (a long backlog is not worked off while closing). */
  stop(): Promise<void> {
    this.stopping = true;
    return this.task.stop();
  }

  /** Deletes, batch after batch, everything due now. */
  async sweep(): Promise<RetentionSweep> {
    const batchSize = this.options.batchSize ?? BATCH_SIZE;
    const before = new Date(this.options.now().getTime() - this.options.retentionDays * DAY_MS);
    const total: RetentionCounts = { ...NO_DELETIONS };
    let after: RootPosition | undefined;
    let skipped = false;
    while (!this.stopping) {
      const batch = await this.options.db.transaction().execute(async (trx) => {
        if (!(await takeRetentionTurn(trx))) return undefined;
        const roots = await lockFinishedRoots(trx, before, after, batchSize);
        return { roots, counts: await deleteFinishedRunTrees(trx, roots, before, this.options.now()) };
      });
      if (!batch) {
        skipped = true;
        break;
      }
      for (const table of Object.keys(total) as Array<keyof RetentionCounts>) total[table] += batch.counts[table];
      if (batch.roots.length < batchSize) break;
      after = batch.roots[batch.roots.length - 1];
    }
    const replicas = skipped || this.stopping ? 0 : await deleteLapsedReplicas(this.options.db, before);
    const counts: Record<string, number> = { ...total, replicas };
    for (const [table, count] of Object.entries(counts)) if (count > 0) this.deleted.inc({ table }, count);
    if (total.runs > 0 || replicas > 0) this.options.logger.info({ deleted: counts, finished_before: before.toISOString() }, 'retention sweep deleted finished runs');
    return { ...total, replicas, skipped };
  }
}
