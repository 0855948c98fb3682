import { sql, type Kysely, type Selectable } from 'kysely';
import type { DB, RunTable } from '../db/schema.js';
import type { RunEnvelope, RunStatus } from './run-types.js';

export interface RunRecord {
  tenant_id: string;
  run_id: string;
  agent_id: string;
  parent_run_id: string | null;
  pipeline_instance_id: string | null;
  session_id: string | null;
  user_id: string | null;
  status: RunStatus;
  request_sha256: string;
  http_status: number | null;
  envelope: RunEnvelope | null;
  created_at: string;
  updated_at: string;
}

export interface NewRun {
  tenant_id: string;
  run_id: string;
  agent_id: string;
  parent_run_id?: string | undefined;
  pipeline_instance_id?: string | undefined;
  session_id?: string | undefined;
  user_id?: string | undefined;
  request_sha256: string;
  trace_id: string;
  /** Millisecond precision, so that list cursors (which carry it) are exact. */
  created_at: Date;
}

/**
 * Claims a run id for its first principal. Returns the claimed record, or the existing one
 * (owned by whoever used the id first) when it was already taken.
 */
export async function claimRun(db: Kysely<DB>, run: NewRun): Promise<{ claimed: boolean; run: RunRecord }> {
  const inserted = await db
    .insertInto('runs')
    .values({
      tenant_id: run.tenant_id,
      run_id: run.run_id,
      owner_agent_id: run.agent_id,
      parent_run_id: run.parent_run_id ?? null,
      pipeline_instance_id: run.pipeline_instance_id ?? null,
      session_id: run.session_id ?? null,
      user_id: run.user_id ?? null,
      status: 'running',
      request_sha256: run.request_sha256,
      trace_id: run.trace_id,
      envelope: null,
      created_at: run.created_at,
      updated_at: run.created_at,
    })
    .onConflict((oc) => oc.columns(['tenant_id', 'run_id']).doNothing())
    .returningAll()
    .executeTakeFirst();
  if (inserted) return { claimed: true, run: toRecord(inserted) };
  const existing = await findRun(db, run.tenant_id, run.run_id);
  if (!existing) throw new Error(`run ${run.run_id} vanished while being claimed`);
  return { claimed: false, run: existing };
}

/**
 * Takes a throttled run back to `running` for its owner's identical resubmission. Only one
 * caller wins when several race; the others see `undefined`.
 */
export async function resumeThrottledRun(db: Kysely<DB>, key: { tenant_id: string; run_id: string; agent_id: string; request_sha256: string }): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({ status: 'running', updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('owner_agent_id', '=', key.agent_id)
    .where('request_sha256', '=', key.request_sha256)
    .where('status', '=', 'throttled')
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

export async function finishRun(db: Kysely<DB>, tenantId: string, runId: string, httpStatus: number, envelope: RunEnvelope): Promise<void> {
  await db
    .updateTable('runs')
    .set({ status: envelope.status, http_status: httpStatus, envelope: JSON.stringify(envelope), updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', tenantId)
    .where('run_id', '=', runId)
    .execute();
}

export async function findRun(db: Kysely<DB>, tenantId: string, runId: string): Promise<RunRecord | undefined> {
  const row = await db.selectFrom('runs').selectAll().where('tenant_id', '=', tenantId).where('run_id', '=', runId).executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

export interface RunQuery {
  tenantId?: string | undefined;
  agentId?: string | undefined;
  status?: RunStatus | undefined;
  after?: { created_at: string; tenant_id: string; run_id: string } | undefined;
  limit: number;
}

/** Newest first; `next` continues the listing when more remain. */
export async function listRuns(db: Kysely<DB>, query: RunQuery): Promise<{ items: RunRecord[]; next: RunQuery['after'] | null }> {
  let q = db.selectFrom('runs').selectAll();
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.agentId !== undefined) q = q.where('owner_agent_id', '=', query.agentId);
  if (query.status !== undefined) q = q.where('status', '=', query.status);
  if (query.after) {
    const { created_at, tenant_id, run_id } = query.after;
    q = q.where(sql<boolean>`(created_at, tenant_id, run_id) < (${new Date(created_at)}, ${tenant_id}, ${run_id})`);
  }
  const rows = await q.orderBy('created_at', 'desc').orderBy('tenant_id', 'desc').orderBy('run_id', 'desc').limit(query.limit + 1).execute();
  const items = rows.slice(0, query.limit).map(toRecord);
  const last = items[items.length - 1];
  return { items, next: rows.length > query.limit && last ? { created_at: last.created_at, tenant_id: last.tenant_id, run_id: last.run_id } : null };
}

function toRecord(row: Selectable<RunTable>): RunRecord {
  const envelope = typeof row.envelope === 'string' ? (JSON.parse(row.envelope) as RunEnvelope) : ((row.envelope as RunEnvelope | null) ?? null);
  return {
    tenant_id: row.tenant_id,
    run_id: row.run_id,
    agent_id: row.owner_agent_id,
    parent_run_id: row.parent_run_id,
    pipeline_instance_id: row.pipeline_instance_id,
    session_id: row.session_id,
    user_id: row.user_id,
    status: row.status as RunStatus,
    request_sha256: row.request_sha256,
    http_status: row.http_status,
    envelope,
    created_at: new Date(row.created_at).toISOString(),
    updated_at: new Date(row.updated_at).toISOString(),
  };
}
