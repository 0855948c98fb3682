import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { DB, RunTable } from '../db/schema.js';
import {
  OPEN_STATUSES,
  type Attribution,
  type RunEnvelope,
  type RunRequest,
  type RunStatus,
  type RunStop,
} from './run-types.js';
import type { ChainHeld } from '../db/lock-order.js';

/** A run as stored: who owns it, where it got to, and what a resume or cascade needs of it. */
export interface RunRecord {
  tenant_id: string;
  run_id: string;
  agent_id: string;
  parent_run_id: string | null;
  pipeline_instance_id: string | null;
  session_id: string | null;
  user_id: string | null;
  status: RunStatus;
  /** null while a sub-run is `queued`: its agent has not sent its request yet. */
  request_sha256: string | null;
  http_status: number | null;
  envelope: RunEnvelope | null;
  created_at: string;
  updated_at: string;
  /** Kept while the run may go on (resume, recovery and cascades read it); dropped when its executor ends it. */
  request: RunRequest | null;
  agent_family: string | null;
  agent_scopes: string[];
  depth: number;
  /** The ancestors, root first. */
  lineage: Attribution[];
  budget_units: number | null;
  keep_open: boolean;
  epoch: number;
  busy: boolean;
  /** The replica whose executor holds the run while it is busy (null before migration 0009). */
  executor_id: string | null;
  stop: RunStop | null;
}

/** The key of a run: run ids are unique within a tenant. */
export interface RunKey {
  tenant_id: string;
  run_id: string;
}

/** What an executor taking a run up records about it and the agent it runs as. */
export interface RunStart {
  request_sha256: string;
  request: RunRequest;
  /** The request's canonical JSON, which `request_sha256` hashes: stored as it is, not serialised again. */
  requestJson?: string | undefined;
  agent_family: string | undefined;
  agent_scopes: string[];
  keep_open: boolean;
}

export type Db = Kysely<DB> | Transaction<DB>;

/**
 * Rows as one JSON array for `jsonb_to_recordset`, each with JSON text already made (a request, an envelope) spliced in
 * under its name (a plain column name) as it is, rather than parsed into the row and serialised again.
 */
export function rowsJsonWith(
  rows: Array<{ row: Record<string, unknown>; with: Record<string, string | null> }>,
): string {
  const json = rows.map(({ row, with: made }) => {
    const spliced = Object.entries(made).map(([name, text]) => `"${name}":${text ?? 'null'}`);
    return `${JSON.stringify(row).slice(0, -1)},${spliced.join(',')}}`;
  });
  return `[${json.join(',')}]`;
}

export const unitsText = (units: number | null | undefined) =>
  units === null || units === undefined ? null : units.toFixed(6);

/** The part of a run an executor re-reads at every call boundary. */
export async function readRunStanding(
  db: Kysely<DB>,
  key: RunKey,
): Promise<Pick<RunRecord, 'status' | 'epoch' | 'stop'> | undefined> {
  const row = await db
    .selectFrom('runs')
    .select(['status', 'epoch', 'stop'])
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .executeTakeFirst();
  return row ? { status: row.status as RunStatus, epoch: row.epoch, stop: parseJson<RunStop>(row.stop) } : undefined;
}

/**
 * `readRunStanding` once every transaction changing the run has committed: the row is
 * share-locked for the read, so a control or cascade holding it (which may have closed the run's
 * hand-off already) is waited for, not read around.
 */
export async function readRunStandingSettled(
  db: Kysely<DB>,
  key: RunKey,
): Promise<Pick<RunRecord, 'status' | 'epoch' | 'stop'> | undefined> {
  const row = await db
    .selectFrom('runs')
    .select(['status', 'epoch', 'stop'])
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .forShare()
    .executeTakeFirst();
  return row ? { status: row.status as RunStatus, epoch: row.epoch, stop: parseJson<RunStop>(row.stop) } : undefined;
}

/** A run by its key, unlocked. */
export async function findRun(db: Db, tenantId: string, runId: string): Promise<RunRecord | undefined> {
  const row = await db
    .selectFrom('runs')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .where('run_id', '=', runId)
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Locks one run for the rest of the transaction. `FOR NO KEY UPDATE`: rows that reference the
 * run (grant uses, hand-offs, approvals) can still be added meanwhile.
 */
export async function lockRun(trx: ChainHeld, key: RunKey): Promise<RunRecord | undefined> {
  const row = await trx
    .selectFrom('runs')
    .selectAll()
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .forNoKeyUpdate()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Locks the open runs among `roots` and all their open descendants (sub-runs, transitively), in
 * one stable order. A hand-off locks its parent before adding a sub-run, so none can slip in.
 */
export async function lockOpenRunTrees(trx: ChainHeld, roots: RunKey[]): Promise<RunRecord[]> {
  if (roots.length === 0) return [];
  const result = await sql<{ tenant_id: string; run_id: string }>`
    with recursive tree(tenant_id, run_id) as (
      select r.tenant_id, r.run_id from runs r
      join unnest(${roots.map((k) => k.tenant_id)}::text[], ${roots.map((k) => k.run_id)}::text[]) as k(t, id)
        on r.tenant_id = k.t and r.run_id = k.id
      union
      select c.tenant_id, c.run_id from runs c join tree p on c.tenant_id = p.tenant_id and c.parent_run_id = p.run_id
      where c.status = any(${[...OPEN_STATUSES]}::text[])
    )
    select tenant_id, run_id from tree
  `.execute(trx);
  if (result.rows.length === 0) return [];
  const rows = await trx
    .selectFrom('runs')
    .selectAll()
    .where((eb) =>
      eb.or(result.rows.map((k) => eb.and([eb('tenant_id', '=', k.tenant_id), eb('run_id', '=', k.run_id)]))),
    )
    .where('status', 'in', [...OPEN_STATUSES])
    .orderBy('tenant_id')
    .orderBy('run_id')
    .forNoKeyUpdate()
    .execute();
  return rows.map(toRecord);
}

/**
 * A tenant's open runs that relied on any of these grants (the tenant's own). Driven by the open runs, each probed
 * for a use by key: a grant's uses grow with history, its tenant's open runs do not.
 */
export async function findOpenRunsUsingGrants(
  trx: Transaction<DB>,
  tenantId: string,
  grantIds: string[],
): Promise<RunKey[]> {
  if (grantIds.length === 0) return [];
  // The statuses as literals, so that `runs_open`'s predicate is provably implied whatever the plan.
  const open = sql.join(OPEN_STATUSES.map((status) => sql.lit(status)));
  const result = await sql<RunKey>`
    select r.tenant_id, r.run_id from runs r
    cross join lateral (
      select 1 from run_grant_uses u
      where u.grant_id = any(${grantIds}::text[]) and u.tenant_id = r.tenant_id and u.run_id = r.run_id
      limit 1
    ) used
    where r.tenant_id = ${tenantId} and r.status in (${open})`.execute(trx);
  return result.rows;
}

/** Open runs of one tenant, or of every tenant (`null`). */
export async function listOpenRuns(trx: Transaction<DB>, tenantId: string | null): Promise<RunRecord[]> {
  let q = trx
    .selectFrom('runs')
    .selectAll()
    .where('status', 'in', [...OPEN_STATUSES]);
  if (tenantId !== null) q = q.where('tenant_id', '=', tenantId);
  const rows = await q.execute();
  return rows.map(toRecord);
}

/** A busy run and the replica holding it. */
export interface BusyRun extends RunKey {
  executor_id: string;
}

/**
 * Busy runs that may be lost, a page at a time in key order (after `after`): held by this
 * replica (`selfId`; the caller knows which of those it still executes), or by a replica whose
 * lease has passed or that is gone.
 */
export async function findBusyRunsToCheck(
  db: Kysely<DB>,
  selfId: string,
  limit: number,
  after?: RunKey,
): Promise<BusyRun[]> {
  let q = db
    .selectFrom('runs as r')
    .select(['r.tenant_id', 'r.run_id', 'r.executor_id'])
    .where('r.busy', '=', true)
    .where('r.executor_id', 'is not', null);
  if (after) q = q.where(sql<boolean>`(r.tenant_id, r.run_id) > (${after.tenant_id}, ${after.run_id})`);
  const rows = await q
    .where((eb) =>
      eb.or([
        eb('r.executor_id', '=', selfId),
        eb.not(
          eb.exists(
            eb
              .selectFrom('replicas as p')
              .select('p.id')
              .whereRef('p.id', '=', 'r.executor_id')
              .where('p.expires_at', '>', sql<Date>`now()`),
          ),
        ),
      ]),
    )
    .orderBy('r.tenant_id')
    .orderBy('r.run_id')
    .limit(limit)
    .execute();
  return rows.map((row) => ({ tenant_id: row.tenant_id, run_id: row.run_id, executor_id: row.executor_id! }));
}

/** Whether a replica's lease still holds (database time). */
export async function replicaAlive(db: Db, replicaId: string): Promise<boolean> {
  const row = await db
    .selectFrom('replicas')
    .select('id')
    .where('id', '=', replicaId)
    .where('expires_at', '>', sql<Date>`now()`)
    .executeTakeFirst();
  return row !== undefined;
}

/** A page of `GET /runs`. */
export interface RunQuery {
  tenantId?: string | undefined;
  agentId?: string | undefined;
  status?: RunStatus | undefined;
  after?: { created_at: string; tenant_id: string; run_id: string } | undefined;
  limit: number;
}

/** Newest first; `next` continues the listing when more remain. */
export async function listRuns(
  db: Kysely<DB>,
  query: RunQuery,
): Promise<{ items: RunRecord[]; next: RunQuery['after'] | null }> {
  let q = db.selectFrom('runs').selectAll();
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.agentId !== undefined) q = q.where('owner_agent_id', '=', query.agentId);
  if (query.status !== undefined) q = q.where('status', '=', query.status);
  if (query.after) {
    const { created_at, tenant_id, run_id } = query.after;
    q = q.where(sql<boolean>`(created_at, tenant_id, run_id) < (${new Date(created_at)}, ${tenant_id}, ${run_id})`);
  }
  const rows = await q
    .orderBy('created_at', 'desc')
    .orderBy('tenant_id', 'desc')
    .orderBy('run_id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toRecord);
  const last = items[items.length - 1];
  return {
    items,
    next:
      rows.length > query.limit && last
        ? { created_at: last.created_at, tenant_id: last.tenant_id, run_id: last.run_id }
        : null,
  };
}

function parseJson<T>(value: unknown): T | null {
  if (value === null || value === undefined) return null;
  return (typeof value === 'string' ? JSON.parse(value) : value) as T;
}

export function toRecord(row: Selectable<RunTable>): RunRecord {
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
    envelope: parseJson<RunEnvelope>(row.envelope),
    created_at: new Date(row.created_at).toISOString(),
    updated_at: new Date(row.updated_at).toISOString(),
    request: parseJson<RunRequest>(row.request),
    agent_family: row.agent_family,
    agent_scopes: row.agent_scopes ?? [],
    depth: row.depth,
    lineage: parseJson<Attribution[]>(row.lineage) ?? [],
    budget_units: row.budget_units === null ? null : Number(row.budget_units),
    keep_open: row.keep_open,
    epoch: row.epoch,
    busy: row.busy,
    executor_id: row.executor_id,
    stop: parseJson<RunStop>(row.stop),
  };
}
