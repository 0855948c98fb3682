import type { Logger } from 'pino';
import { Counter, type Registry } from 'prom-client';
import { BackgroundTask } from '../db/background-task.js';
import { isDatabaseUnavailable } from '../db/unavailable.js';
import { IDEMPOTENCY_KEY_TTL_MS } from '../idempotency/idempotency-keys.js';
import { deleteKeysBefore } from '../idempotency/idempotency-repository.js';
import {
  deleteFinishedRunTrees,
  deleteLapsedReplicas,
  lockFinishedRoot,
  lockFinishedRoots,
  NO_DELETIONS,
  takeRetentionTurn,
  type RetentionCounts,
  type RootPosition,
} from './retention-repository.js';
import type { Database } from '../db/database.js';

/** Root runs looked at per transaction: each batch holds its locks for a few milliseconds. */
const BATCH_SIZE = 100;

const DAY_MS = 86_400_000;

/**
 * How long a tree whose deletion failed is left out of this replica's sweeps before it is tried
 * again: what fails it (a tree too large to delete within the statement timeout, a row of it
 * something else refers to) seldom goes away by itself, and each try costs a failed batch.
 */
const SET_ASIDE_MS = DAY_MS;

/** What the sweeper is built from, by the composition root. */
export interface RetentionSweeperOptions {
  database: Database;
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
  /** Idempotency keys older than their 24 hours. */
  idempotency_keys: number;
  skipped: boolean;
  /** The roots of the trees whose deletion failed in this sweep, now set aside. */
  failed: Array<{ tenant_id: string; run_id: string }>;
}

/** What one batch deleted; `skipped` when another replica took the turn. */
interface Batch {
  roots: RootPosition[];
  counts: RetentionCounts;
  skipped: boolean;
  /** The batch was cut short (its statements time out): the rest waits for the next round. */
  cut: boolean;
}

/**
 * Deletes run trees finished more than `retentionDays` ago, in bounded batches under an advisory
 * lock; the audit log is never deleted. What goes and what stays: docs/operations.md#retention.
 */
export class RetentionSweeper {
  private readonly task: BackgroundTask;
  private readonly deleted: Counter<'table'>;
  private readonly failures: Counter;
  /** Roots whose tree failed to delete, by key, with when (ms) they are tried again. */
  private readonly setAside = new Map<string, number>();
  private stopping = false;

  constructor(private readonly options: RetentionSweeperOptions) {
    this.deleted = new Counter({
      name: 'toolgate_retention_deleted_rows_total',
      help: 'Rows the retention sweep deleted, by table (finished runs and their bookkeeping)',
      labelNames: ['table'],
      registers: [options.registry],
    });
    this.failures = new Counter({
      name: 'toolgate_retention_failed_trees_total',
      help: 'Run trees the retention sweep failed to delete (each is logged, and left out of the sweep for a day)',
      registers: [options.registry],
    });
    this.task = new BackgroundTask({
      name: 'retention sweep',
      run: () => this.sweep(),
      intervalMs: () => options.intervalMs,
      logger: options.logger,
    });
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
    const now = this.options.now().getTime();
    for (const [key, until] of this.setAside) if (until <= now) this.setAside.delete(key);
    const total: RetentionCounts = { ...NO_DELETIONS };
    const failed: RootPosition[] = [];
    let after: RootPosition | undefined;
    let skipped = false;
    while (!this.stopping) {
      const batch = await this.deleteBatch(before, after, batchSize, failed);
      for (const table of Object.keys(total) as Array<keyof RetentionCounts>) total[table] += batch.counts[table];
      if (batch.skipped) skipped = true;
      if (batch.skipped || batch.cut || batch.roots.length < batchSize) break;
      after = batch.roots[batch.roots.length - 1];
    }
    const replicas = skipped || this.stopping ? 0 : await deleteLapsedReplicas(this.options.database.control, before);
    const keysBefore = new Date(this.options.now().getTime() - IDEMPOTENCY_KEY_TTL_MS);
    const idempotency_keys =
      skipped || this.stopping ? 0 : await deleteKeysBefore(this.options.database.control, keysBefore);
    const counts: Record<string, number> = { ...total, replicas, idempotency_keys };
    for (const [table, count] of Object.entries(counts)) if (count > 0) this.deleted.inc({ table }, count);
    if (total.runs > 0 || replicas > 0)
      this.options.logger.info(
        { deleted: counts, finished_before: before.toISOString() },
        'retention sweep deleted finished runs',
      );
    return {
      ...total,
      replicas,
      idempotency_keys,
      skipped,
      failed: failed.map(({ tenant_id, run_id }) => ({ tenant_id, run_id })),
    };
  }

  /** The next batch of roots after `after`, in one transaction; if that fails, one tree at a time. */
  private async deleteBatch(
    before: Date,
    after: RootPosition | undefined,
    batchSize: number,
    failed: RootPosition[],
  ): Promise<Batch> {
    const found: { roots?: RootPosition[] } = {};
    try {
      return await this.options.database.control.transaction().execute(async (trx) => {
        if (!(await takeRetentionTurn(trx))) return { roots: [], counts: NO_DELETIONS, skipped: true, cut: false };
        const roots = (found.roots = await lockFinishedRoots(trx, before, after, batchSize));
        const due = roots.filter((root) => !this.setAside.has(keyOf(root)));
        return {
          roots,
          counts: await deleteFinishedRunTrees(trx, due, before, this.options.now()),
          skipped: false,
          cut: false,
        };
      });
    } catch (error) {
      if (!found.roots || lostDatabase(error)) throw error;
      return { roots: found.roots, ...(await this.deleteEach(found.roots, before, failed)) };
    }
  }

  /**
   * Deletes these trees one transaction each, and sets aside those that fail. A statement
   * timeout ends the batch there: were the server itself too slow, trying every tree would cost
   * a timeout each.
   */
  private async deleteEach(roots: RootPosition[], before: Date, failed: RootPosition[]): Promise<Omit<Batch, 'roots'>> {
    const counts: RetentionCounts = { ...NO_DELETIONS };
    for (const root of roots) {
      if (this.stopping) break;
      if (this.setAside.has(keyOf(root))) continue;
      try {
        const deleted = await this.options.database.control.transaction().execute(async (trx) => {
          if (!(await takeRetentionTurn(trx))) return undefined;
          return deleteFinishedRunTrees(trx, await lockFinishedRoot(trx, root, before), before, this.options.now());
        });
        if (!deleted) return { counts, skipped: true, cut: false };
        for (const table of Object.keys(counts) as Array<keyof RetentionCounts>) counts[table] += deleted[table];
      } catch (error) {
        if (lostDatabase(error)) throw error;
        const until = new Date(this.options.now().getTime() + SET_ASIDE_MS);
        this.setAside.set(keyOf(root), until.getTime());
        failed.push(root);
        this.failures.inc();
        this.options.logger.warn(
          { err: error, tenant_id: root.tenant_id, run_id: root.run_id, retry_after: until.toISOString() },
          'retention sweep could not delete a finished run tree; it is set aside',
        );
        if (isStatementTimeout(error)) return { counts, skipped: false, cut: true };
      }
    }
    return { counts, skipped: false, cut: false };
  }
}

function keyOf(root: RootPosition): string {
  return `${root.tenant_id}\u0000${root.run_id}`;
}

function isStatementTimeout(error: unknown): boolean {
  return (error as { code?: unknown }).code === '57014';
}

/** The database could not be reached, as opposed to refusing (or timing out) a tree's deletion. */
function lostDatabase(error: unknown): boolean {
  return isDatabaseUnavailable(error) && !isStatementTimeout(error);
}
