import { sql, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import type { Attribution } from './run-types.js';
import { toRecord, unitsText, type RunKey, type RunRecord } from './run-repository.js';

/**
 * A sub-run created by a hand-off, `queued` (or `awaiting_approval` of the hand-off), owned by
 * the sub-agent, with the lineage and budget the hand-off gives it.
 */
export async function insertSubRun(
  trx: Transaction<DB>,
  run: RunKey & {
    agent_id: string;
    parent_run_id: string;
    status: 'queued' | 'awaiting_approval';
    depth: number;
    lineage: Attribution[];
    budget_units: number;
    trace_id: string | null;
    created_at: Date;
  },
): Promise<RunRecord | undefined> {
  const row = await trx
    .insertInto('runs')
    .values({
      tenant_id: run.tenant_id,
      run_id: run.run_id,
      owner_agent_id: run.agent_id,
      parent_run_id: run.parent_run_id,
      pipeline_instance_id: null,
      session_id: null,
      user_id: null,
      status: run.status,
      request_sha256: null,
      trace_id: run.trace_id,
      envelope: null,
      created_at: run.created_at,
      updated_at: run.created_at,
      depth: run.depth,
      lineage: JSON.stringify(run.lineage),
      budget_units: unitsText(run.budget_units),
      busy: false,
    })
    .onConflict((oc) => oc.columns(['tenant_id', 'run_id']).doNothing())
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Marks a parent run (locked by the caller) as just handed off, a new row version: a run end batched meanwhile, whose
 * snapshot predates the sub-run, finds the row changed and leaves the parent to be ended under the lock.
 */
export async function markHandedOff(trx: Transaction<DB>, key: RunKey): Promise<void> {
  await trx
    .updateTable('runs')
    .set({ updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}

/** Moves a run that waited for its hand-off's approval to `queued`. */
export async function releaseApprovedSubRun(trx: Transaction<DB>, key: RunKey): Promise<boolean> {
  const row = await trx
    .updateTable('runs')
    .set({ status: 'queued', updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('status', '=', 'awaiting_approval')
    .where('request_sha256', 'is', null)
    .returning('run_id')
    .executeTakeFirst();
  return row !== undefined;
}
