import { sql, type Kysely } from 'kysely';
import type { DB } from '../db/schema.js';
import type { RunStatus } from './run-types.js';
import { toRecord, unitsText, type Db, type RunKey, type RunRecord, type RunStart } from './run-repository.js';

/**
 * Takes a throttled run back to `running` for its owner's identical resubmission. Only one
 * caller wins when several race; the others see `undefined`.
 */
export async function resumeThrottledRun(
  db: Kysely<DB>,
  key: { tenant_id: string; run_id: string; agent_id: string; request_sha256: string },
  executorId: string,
): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({
      status: 'running',
      busy: true,
      executor_id: executorId,
      epoch: sql<number>`epoch + 1`,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('owner_agent_id', '=', key.agent_id)
    .where('request_sha256', '=', key.request_sha256)
    .where('status', '=', 'throttled')
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Starts a queued sub-run with its agent's first request; `budget_units` only ever lowers the
 * hand-off's. Only one caller wins when several race.
 */
export async function startQueuedRun(
  db: Kysely<DB>,
  key: RunKey & { agent_id: string },
  start: RunStart & {
    budget_units: number | undefined;
    pipeline_instance_id?: string | undefined;
    session_id?: string | undefined;
    user_id?: string | undefined;
  },
  executorId: string,
): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({
      status: 'running',
      busy: true,
      executor_id: executorId,
      epoch: sql<number>`epoch + 1`,
      request_sha256: start.request_sha256,
      request: start.requestJson ?? JSON.stringify(start.request),
      agent_family: start.agent_family ?? null,
      agent_scopes: start.agent_scopes,
      keep_open: start.keep_open,
      pipeline_instance_id: start.pipeline_instance_id ?? null,
      session_id: start.session_id ?? null,
      user_id: start.user_id ?? null,
      ...(start.budget_units !== undefined
        ? { budget_units: sql<string>`least(budget_units, ${unitsText(start.budget_units)}::numeric)` }
        : {}),
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('owner_agent_id', '=', key.agent_id)
    .where('status', '=', 'queued')
    .where('busy', '=', false)
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Takes an idle run in one of `from` up for an executor: `running`, a new epoch, busy. Only one
 * caller wins when several race.
 */
export async function claimIdleRun(
  db: Db,
  key: RunKey,
  from: readonly RunStatus[],
  executorId: string,
): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({
      status: 'running',
      busy: true,
      executor_id: executorId,
      epoch: sql<number>`epoch + 1`,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('status', 'in', [...from])
    .where('busy', '=', false)
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}
