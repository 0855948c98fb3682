import type { Kysely, Selectable, Transaction } from 'kysely';
import type { DB, HandoffTable } from '../db/schema.js';
import type { ApprovalRequirement, Handoff } from './handoff.js';
import type { ChainHeld } from '../db/lock-order.js';

type Db = Kysely<DB> | Transaction<DB>;

/** Records a hand-off, open. */
export async function insertHandoff(
  trx: Transaction<DB>,
  handoff: Omit<Handoff, 'status' | 'spent_units' | 'returned_units' | 'closed_at'>,
): Promise<Handoff> {
  const row = await trx
    .insertInto('handoffs')
    .values({
      id: handoff.id,
      tenant_id: handoff.tenant_id,
      parent_run_id: handoff.parent_run_id,
      sub_run_id: handoff.sub_run_id,
      parent_agent_id: handoff.parent_agent_id,
      sub_agent_id: handoff.sub_agent_id,
      budget_units: handoff.budget_units.toFixed(6),
      delegable_tool_ids: handoff.delegable_tool_ids,
      max_fanout: handoff.max_fanout,
      capability_modifiers: JSON.stringify(handoff.capability_modifiers),
      approval_requirement: handoff.approval_requirement,
      depth: handoff.depth,
      status: 'open',
      created_at: handoff.created_at,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return toHandoff(row);
}

/** The hand-off that created a sub-run, if it was created by one. */
export async function findHandoffOfSubRun(db: Db, tenantId: string, subRunId: string): Promise<Handoff | undefined> {
  const row = await db
    .selectFrom('handoffs')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .where('sub_run_id', '=', subRunId)
    .executeTakeFirst();
  return row ? toHandoff(row) : undefined;
}

/** The hand-offs a run made, oldest first. */
export async function listHandoffsFrom(db: Db, tenantId: string, parentRunId: string): Promise<Handoff[]> {
  const rows = await db
    .selectFrom('handoffs')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .where('parent_run_id', '=', parentRunId)
    .orderBy('created_at')
    .orderBy('id')
    .execute();
  return rows.map(toHandoff);
}

/** The open hand-offs that created any of these runs. */
export async function findOpenHandoffsOfSubRuns(
  trx: ChainHeld,
  keys: Array<{ tenant_id: string; run_id: string }>,
): Promise<Handoff[]> {
  if (keys.length === 0) return [];
  const rows = await trx
    .selectFrom('handoffs')
    .selectAll()
    .where('status', '=', 'open')
    .where((eb) => eb.or(keys.map((k) => eb.and([eb('tenant_id', '=', k.tenant_id), eb('sub_run_id', '=', k.run_id)]))))
    .forNoKeyUpdate()
    .execute();
  return rows.map(toHandoff);
}

/** Closes an open hand-off with what its sub-run used and what went back. */
export async function closeHandoff(
  trx: ChainHeld,
  id: string,
  close: { spentUnits: number; returnedUnits: number; at: Date },
): Promise<void> {
  await trx
    .updateTable('handoffs')
    .set({
      status: 'closed',
      spent_units: close.spentUnits.toFixed(6),
      returned_units: close.returnedUnits.toFixed(6),
      closed_at: close.at,
    })
    .where('id', '=', id)
    .where('status', '=', 'open')
    .execute();
}

function toHandoff(row: Selectable<HandoffTable>): Handoff {
  return {
    id: row.id,
    tenant_id: row.tenant_id,
    parent_run_id: row.parent_run_id,
    sub_run_id: row.sub_run_id,
    parent_agent_id: row.parent_agent_id,
    sub_agent_id: row.sub_agent_id,
    budget_units: Number(row.budget_units),
    delegable_tool_ids: row.delegable_tool_ids,
    max_fanout: row.max_fanout,
    capability_modifiers:
      typeof row.capability_modifiers === 'string' ? JSON.parse(row.capability_modifiers) : row.capability_modifiers,
    approval_requirement: row.approval_requirement as ApprovalRequirement,
    depth: row.depth,
    status: row.status as Handoff['status'],
    spent_units: row.spent_units === null ? null : Number(row.spent_units),
    returned_units: row.returned_units === null ? null : Number(row.returned_units),
    created_at: new Date(row.created_at),
    closed_at: row.closed_at === null ? null : new Date(row.closed_at),
  };
}
