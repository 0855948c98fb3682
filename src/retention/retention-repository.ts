import { sql, type Kysely, type Transaction } from 'kysely';
import { runTotalRef } from '../budgets/run-allowance.js';
import type { DB } from '../db/schema.js';

// Any constant works; it only has to be the same in every replica (and differ from the migrations').
const RETENTION_LOCK_KEY = 7_406_331_206;

/**
 * Takes the sweep's turn for the rest of the transaction, if no other replica has it: one replica
 * deletes at a time, and the others skip their round at the cost of this one statement.
 */
export async function takeRetentionTurn(trx: Transaction<DB>): Promise<boolean> {
  const result = await sql<{
    taken: boolean;
  }>`select pg_try_advisory_xact_lock(${RETENTION_LOCK_KEY}) as taken`.execute(trx);
  return result.rows[0]?.taken === true;
}

/** A root run in the sweep's order; `updated_at` as the database's text, so it is exact to the microsecond. */
export interface RootPosition {
  updated_at_text: string;
  tenant_id: string;
  run_id: string;
}

/**
 * Root runs that finished before `before`, oldest first, after `after`, locked. A root somebody
 * holds locked is skipped (the next round finds it). The status list is spelled out as in the
 * index `runs_finished_roots`, so that the planner can use it.
 */
export async function lockFinishedRoots(
  trx: Transaction<DB>,
  before: Date,
  after: RootPosition | undefined,
  limit: number,
): Promise<RootPosition[]> {
  const result = await sql<RootPosition>`
    select updated_at::text as updated_at_text, tenant_id, run_id from runs
    where parent_run_id is null and status in ('completed', 'failed', 'cancelled', 'killed') and updated_at < ${before}
      ${after ? sql`and (updated_at, tenant_id, run_id) > (${after.updated_at_text}::timestamptz, ${after.tenant_id}, ${after.run_id})` : sql``}
    order by runs.updated_at, runs.tenant_id, runs.run_id
    limit ${limit}
    for update skip locked`.execute(trx);
  return result.rows;
}

/**
 * One root `lockFinishedRoots` found, locked again by a transaction of its own: none if it is
 * gone or somebody holds it (the next round finds it).
 */
export async function lockFinishedRoot(
  trx: Transaction<DB>,
  root: RootPosition,
  before: Date,
): Promise<RootPosition[]> {
  const result = await sql<RootPosition>`
    select updated_at::text as updated_at_text, tenant_id, run_id from runs
    where tenant_id = ${root.tenant_id} and run_id = ${root.run_id}
      and parent_run_id is null and status in ('completed', 'failed', 'cancelled', 'killed') and updated_at < ${before}
    for update skip locked`.execute(trx);
  return result.rows;
}

/** How many rows of each table a deletion removed. */
export interface RetentionCounts {
  runs: number;
  approvals: number;
  handoffs: number;
  run_grant_uses: number;
  budget_reservations: number;
  budget_counters: number;
}

export const NO_DELETIONS: RetentionCounts = {
  runs: 0,
  approvals: 0,
  handoffs: 0,
  run_grant_uses: 0,
  budget_reservations: 0,
  budget_counters: 0,
};

/**
 * Deletes the trees among these locked roots that retention may drop whole (docs/operations.md#retention), with what
 * was kept only for their runs. A finished run never changes again, so what is found still holds.
 */
export async function deleteFinishedRunTrees(
  trx: Transaction<DB>,
  roots: RootPosition[],
  before: Date,
  now: Date,
): Promise<RetentionCounts> {
  if (roots.length === 0) return NO_DELETIONS;
  const found = await sql<{ root_tenant: string; root_run: string; tenant_id: string; run_id: string; done: boolean }>`
    with recursive tree(root_tenant, root_run, tenant_id, run_id) as (
      select t, r, t, r from unnest(${roots.map((k) => k.tenant_id)}::text[], ${roots.map((k) => k.run_id)}::text[]) as k(t, r)
      union all
      select tree.root_tenant, tree.root_run, c.tenant_id, c.run_id
      from tree join runs c on c.tenant_id = tree.tenant_id and c.parent_run_id = tree.run_id
    )
    select tree.root_tenant, tree.root_run, tree.tenant_id, tree.run_id,
           r.status in ('completed', 'failed', 'cancelled', 'killed') and not r.busy and r.updated_at < ${before}
             and not exists (select 1 from budget_reservations b
                             where b.tenant_id = r.tenant_id and b.run_id = r.run_id and b.status = 'reserved')
             -- What an operator set on the run id still applies to whoever uses the id next: the
             -- id is not freed while a live run budget or a live per-run grant names it.
             and not exists (select 1 from budgets bu
                             where bu.tenant_id = r.tenant_id and bu.scope = 'run' and coalesce(bu.agent_id, '') = ''
                               and coalesce(bu.run_id, '') = r.run_id and bu.removed_at is null)
             and not exists (select 1 from grants g
                             where g.tenant_id = r.tenant_id and g.scope = 'per-run' and g.scope_ref = r.run_id
                               and g.revoked_at is null and g.expires_at > ${now}) as done
    from tree join runs r on r.tenant_id = tree.tenant_id and r.run_id = tree.run_id`.execute(trx);
  const trees = new Map<string, { done: boolean; runs: Array<{ tenant_id: string; run_id: string }> }>();
  for (const row of found.rows) {
    const key = `${row.root_tenant}\u0000${row.root_run}`;
    const tree = trees.get(key) ?? { done: true, runs: [] };
    tree.done &&= row.done;
    tree.runs.push({ tenant_id: row.tenant_id, run_id: row.run_id });
    trees.set(key, tree);
  }
  const runs = [...trees.values()].filter((tree) => tree.done).flatMap((tree) => tree.runs);
  if (runs.length === 0) return NO_DELETIONS;
  const tenants = runs.map((run) => run.tenant_id);
  const ids = runs.map((run) => run.run_id);
  const keys = sql`unnest(${tenants}::text[], ${ids}::text[]) as k(t, r)`;

  // The sub-runs too, before anything that refers to them (the roots are locked already).
  await sql`
    select 1 from runs r join ${keys} on r.tenant_id = k.t and r.run_id = k.r
    order by r.tenant_id, r.run_id
    for update of r`.execute(trx);
  const approvals = await sql`delete from approvals a using ${keys} where a.tenant_id = k.t and a.run_id = k.r`.execute(
    trx,
  );
  // Every hand-off of a tree has its sub-run in the tree.
  const handoffs =
    await sql`delete from handoffs h using ${keys} where h.tenant_id = k.t and h.sub_run_id = k.r`.execute(trx);
  const uses = await sql`delete from run_grant_uses u using ${keys} where u.tenant_id = k.t and u.run_id = k.r`.execute(
    trx,
  );
  const ledger = await sql<{ reservations: string }>`
    with gone as (
      delete from budget_reservations b using ${keys}
      where b.tenant_id = k.t and b.run_id = k.r and b.status <> 'reserved'
      returning b.tenant_id, b.agent_id, b.status, b.actual_units
    ),
    spent as (
      select tenant_id, agent_id, sum(actual_units) as units from gone
      where status = 'settled' group by tenant_id, agent_id
    ),
    archived as (
      insert into budget_spend_archive (tenant_id, agent_id, spent_units)
      select tenant_id, agent_id, units from spent where units > 0
      order by tenant_id, agent_id
      on conflict (tenant_id, agent_id) do update set spent_units = budget_spend_archive.spent_units + excluded.spent_units
      returning 1
    )
    select (select count(*) from gone) as reservations, (select count(*) from archived) as archived`.execute(trx);
  const totals = runs.map((run) => runTotalRef(run.tenant_id, run.run_id));
  const counters = await sql`
    delete from budget_counters c using unnest(${totals.map((ref) => ref.key)}::text[], ${totals.map((ref) => ref.periodStart)}::timestamptz[]) as t(k, p)
    where c.counter_key = t.k and c.period_start = t.p and c.counter_key = any(${totals.map((ref) => ref.key)}::text[])`.execute(
    trx,
  );
  const deleted = await sql`delete from runs x using ${keys} where x.tenant_id = k.t and x.run_id = k.r`.execute(trx);
  return {
    runs: Number(deleted.numAffectedRows ?? 0),
    approvals: Number(approvals.numAffectedRows ?? 0),
    handoffs: Number(handoffs.numAffectedRows ?? 0),
    run_grant_uses: Number(uses.numAffectedRows ?? 0),
    budget_reservations: Number(ledger.rows[0]?.reservations ?? 0),
    budget_counters: Number(counters.numAffectedRows ?? 0),
  };
}

/**
 * Forgets replicas whose lease passed before `before`: they stopped without giving it up (killed,
 * crashed), their runs were recovered long ago, and a replica that is gone and one whose lease has
 * passed are the same to recovery.
 */
export async function deleteLapsedReplicas(db: Kysely<DB>, before: Date): Promise<number> {
  const result = await db.deleteFrom('replicas').where('expires_at', '<', before).executeTakeFirst();
  return Number(result.numDeletedRows);
}
