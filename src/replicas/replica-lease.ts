import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { BackgroundTask } from '../db/background-task.js';
import { CLOSE_STEP_WAIT_MS, waitAtMost } from '../db/wait-at-most.js';
import { removeReplica, renewReplica, type ReplicaIdentity } from './replica-repository.js';
import type { Database } from '../db/database.js';

/** What a lease is built from, by the composition root. */
export interface ReplicaLeaseOptions {
  database: Database;
  id: string;
  /** How long a renewal holds; renewed every third of it. */
  leaseMs: number;
  logger: Logger;
}

/**
 * This replica's lease in `replicas`: proof to the others that it is alive and executing its busy runs. Once an
 * unrenewed lease may have passed, `valid()` is false and nothing is dispatched (docs/design/run-recovery.md).
 */
export class ReplicaLease {
  readonly identity: ReplicaIdentity;
  private readonly task: BackgroundTask;
  /** When (this process's monotonic clock) the last renewal that landed was sent. */
  private renewedAt = Number.NEGATIVE_INFINITY;

  constructor(private readonly options: ReplicaLeaseOptions) {
    this.identity = { id: options.id, hostname: hostname(), pid: process.pid };
    this.task = new BackgroundTask({
      name: 'replica lease renewal',
      run: () => this.renew(),
      // Retried sooner while failing, so that dispatching resumes soon after the database returns.
      intervalMs: (failing) => (failing ? Math.min(1_000, options.leaseMs / 3) : options.leaseMs / 3),
      logger: options.logger,
    });
  }

  get id(): string {
    return this.identity.id;
  }

  /**
   * Registers the replica, then renews in the background. A replica may start while its
   * database is away: it then dispatches nothing until its first renewal lands.
   */
  async start(): Promise<void> {
    await this.renew().catch((error: unknown) => {
      this.options.logger.warn({ err: error }, 'registering the replica lease failed; retrying');
      this.task.failing = true;
    });
    this.task.start();
  }

  /**
   * Whether the lease surely still holds: the last renewal that landed was sent less than a
   * lease ago. (Its expiry, set by the database after the send, is later still.)
   */
  valid(): boolean {
    return performance.now() - this.renewedAt < this.options.leaseMs;
  }

  /**
   * Stops renewing and gives the lease up (call once nothing executes any more): nothing is
   * dispatched after. A database that does not answer within `CLOSE_STEP_WAIT_MS` (a silent
   * partition) is not waited for: the lease lapses, as a killed replica's does.
   */
  async stop(): Promise<void> {
    await this.task.stop();
    this.renewedAt = Number.NEGATIVE_INFINITY;
    const removed = removeReplica(this.options.database.control, this.id, CLOSE_STEP_WAIT_MS).catch(
      (error: unknown) => {
        this.options.logger.warn({ err: error }, 'could not give the replica lease up; it will lapse');
      },
    );
    if (!(await waitAtMost(removed)))
      this.options.logger.warn('the database did not answer giving the replica lease up; it will lapse');
  }

  private async renew(): Promise<void> {
    const sent = performance.now();
    await renewReplica(this.options.database.control, this.identity, this.options.leaseMs);
    this.renewedAt = sent;
  }
}
