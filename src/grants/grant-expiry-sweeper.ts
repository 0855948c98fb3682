import type { Logger } from 'pino';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { BackgroundTask } from '../db/background-task.js';
import { claimLapsedGrants } from './grant-repository.js';
import type { GrantsEndedHook } from './grant-service.js';
import type { Database } from '../db/database.js';

/** The audit actor of expiry: time, not an operator, ended the grant. */
export const EXPIRY_ACTOR = 'system.expiry';

const BATCH = 200;

/** What the sweeper is built from, by the composition root. */
export interface GrantExpirySweeperOptions {
  database: Database;
  now: () => Date;
  intervalMs: number;
  logger: Logger;
  /** The runs that relied on a lapsed grant stop in the transaction that records the lapse. */
  onGrantsEnded?: GrantsEndedHook | undefined;
}

/**
 * Records each lapse once as `grant.expired` (resolution already refuses the grant at `expires_at`) and stops the runs
 * relying on it. Every replica runs one; claiming and recording share a transaction, so each lapse is recorded once.
 */
export class GrantExpirySweeper {
  private readonly task: BackgroundTask;

  constructor(private readonly options: GrantExpirySweeperOptions) {
    this.task = new BackgroundTask({
      name: 'grant expiry sweep',
      run: () => this.sweep(),
      intervalMs: () => options.intervalMs,
      logger: options.logger,
    });
  }

  start(): void {
    this.task.start();
  }

  stop(): Promise<void> {
    return this.task.stop();
  }

  /** Records every lapse due now; returns how many it recorded. */
  async sweep(): Promise<number> {
    let recorded = 0;
    for (;;) {
      const now = this.options.now();
      const count = await this.options.database.control.transaction().execute(async (trx) => {
        const lapsed = await claimLapsedGrants(trx, now, BATCH);
        await writeAuditEvents(
          trx,
          lapsed.map((grant) => ({
            occurredAt: now,
            event: {
              event_type: 'grant.expired',
              actor: EXPIRY_ACTOR,
              tenant_id: grant.tenant_id,
              agent_id: grant.agent_id,
              tool_id: grant.tool_id,
              status: 'expired',
              reason_code: 'grant_expired',
              details: {
                grant_id: grant.id,
                scope: grant.scope,
                scope_ref: grant.scope_ref,
                expires_at: grant.expires_at.toISOString(),
                recorded_late_ms: now.getTime() - grant.expires_at.getTime(),
                cascade_depth: 0,
              },
            },
          })),
        );
        if (lapsed.length > 0)
          await this.options.onGrantsEnded?.(trx, lapsed, { code: 'grant_expired', actor: EXPIRY_ACTOR }, now);
        return lapsed.length;
      });
      recorded += count;
      if (count < BATCH) return recorded;
    }
  }
}
