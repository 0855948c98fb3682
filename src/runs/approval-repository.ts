import { sql, type ExpressionBuilder, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { ApprovalTable, DB } from '../db/schema.js';
import { approvalStatusAt, type Approval, type ApprovalKind, type ApprovalStatus } from './approval.js';
import type { ChainHeld } from '../db/lock-order.js';

type Db = Kysely<DB> | Transaction<DB>;

/** A proposal as it is recorded: pending, undecided. */
export type NewApproval = Omit<Approval, 'status' | 'decided_by' | 'decided_at' | 'rationale'>;

/** Records a proposal, pending; a tool call's with the SHA-256 of the exact call (`callSha256`). */
export async function insertApproval(
  trx: Transaction<DB>,
  approval: NewApproval & { call_sha256?: string },
): Promise<Approval> {
  const row = await trx
    .insertInto('approvals')
    .values({
      ...approval,
      input: approval.input === undefined ? null : JSON.stringify(approval.input),
      status: 'pending',
      decided_by: null,
      decided_at: null,
      rationale: null,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return toApproval(row);
}

/**
 * The newest approval of an agent's exact call that may still let it through: pending and not past its time, or approved,
 * not past its time and unused (its run still waits for it). Runs that moved on used theirs, or will not.
 */
export async function findOpenCallApproval(
  db: Db,
  query: { tenantId: string; agentId: string; callSha256: string; now: Date },
): Promise<Approval | undefined> {
  const row = await db
    .selectFrom('approvals')
    .innerJoin('runs', (join) =>
      join.onRef('runs.tenant_id', '=', 'approvals.tenant_id').onRef('runs.run_id', '=', 'approvals.run_id'),
    )
    .selectAll('approvals')
    .where('approvals.tenant_id', '=', query.tenantId)
    .where('approvals.agent_id', '=', query.agentId)
    .where('approvals.call_sha256', '=', query.callSha256)
    .where('approvals.status', 'in', ['pending', 'approved'])
    .where('approvals.expires_at', '>', query.now)
    .where('runs.status', '=', 'awaiting_approval')
    .orderBy('approvals.created_at', 'desc')
    .limit(1)
    .executeTakeFirst();
  return row ? toApproval(row) : undefined;
}

/** An approval by id, unlocked. */
export async function findApproval(db: Db, id: string): Promise<Approval | undefined> {
  const row = await db.selectFrom('approvals').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? toApproval(row) : undefined;
}

/** Whether an approval has lapsed by `now`: approved, past its time and unused (see `lapsedAt`). */
export async function isApprovalLapsed(db: Db, id: string, now: Date): Promise<boolean> {
  const row = await db
    .selectFrom('approvals')
    .select((eb) => lapsedAt(eb, now).as('lapsed'))
    .where('id', '=', id)
    .executeTakeFirst();
  return Boolean(row?.lapsed);
}

/** Locks an approval for the rest of the transaction, after its run (docs/design/lock-order.md). */
export async function lockApproval(trx: ChainHeld, id: string): Promise<Approval | undefined> {
  const row = await trx.selectFrom('approvals').selectAll().where('id', '=', id).forNoKeyUpdate().executeTakeFirst();
  return row ? toApproval(row) : undefined;
}

/** The newest approval of a run's step (tool calls) or of a sub-run's hand-off (`stepIndex` null). */
export async function findLatestApproval(
  db: Db,
  tenantId: string,
  runId: string,
  stepIndex: number | null,
): Promise<Approval | undefined> {
  let q = db.selectFrom('approvals').selectAll().where('tenant_id', '=', tenantId).where('run_id', '=', runId);
  q =
    stepIndex === null
      ? q.where('kind', '=', 'handoff')
      : q.where('kind', '=', 'tool_call').where('step_index', '=', stepIndex);
  const row = await q.orderBy('created_at', 'desc').orderBy('id', 'desc').limit(1).executeTakeFirst();
  return row ? toApproval(row) : undefined;
}

/**
 * The newest approval of the step a run goes on with (its first not completed, by its stored
 * envelope): it may have been paused or throttled while it waited for one, or after one let its
 * call through admission.
 */
export async function findNextStepApproval(
  db: Db,
  run: { tenant_id: string; run_id: string; envelope: { steps: Array<{ index: number; status: string }> } | null },
): Promise<Approval | undefined> {
  const next = (run.envelope?.steps ?? []).find((step) => step.status !== 'completed');
  return next ? findLatestApproval(db, run.tenant_id, run.run_id, next.index) : undefined;
}

/** Records a decision on a pending approval; undefined when it was no longer pending. */
export async function decideApproval(
  trx: Transaction<DB>,
  id: string,
  decision: {
    status: 'approved' | 'rejected' | 'expired' | 'cancelled';
    decidedBy?: string;
    rationale?: string;
    at: Date;
  },
): Promise<Approval | undefined> {
  const row = await trx
    .updateTable('approvals')
    .set({
      status: decision.status,
      ...(decision.decidedBy !== undefined
        ? { decided_by: decision.decidedBy, decided_at: decision.at, rationale: decision.rationale ?? null }
        : {}),
    })
    .where('id', '=', id)
    .where('status', 'in', decision.status === 'expired' ? ['pending', 'approved'] : ['pending'])
    .returningAll()
    .executeTakeFirst();
  return row ? toApproval(row) : undefined;
}

/** Withdraws the pending proposals of runs that ended, or of a step proposed anew. */
export async function cancelPendingApprovals(
  trx: ChainHeld,
  runs: Array<{ tenant_id: string; run_id: string }>,
  stepIndex?: number,
): Promise<Approval[]> {
  if (runs.length === 0) return [];
  let q = trx
    .updateTable('approvals')
    .set({ status: 'cancelled' })
    .where('status', '=', 'pending')
    .where((eb) => eb.or(runs.map((k) => eb.and([eb('tenant_id', '=', k.tenant_id), eb('run_id', '=', k.run_id)]))));
  if (stepIndex !== undefined) q = q.where('step_index', '=', stepIndex);
  const rows = await q.returningAll().execute();
  return rows.map(toApproval);
}

/** A page of `GET /approvals`. */
export interface ApprovalQuery {
  tenantId?: string | undefined;
  status?: ApprovalStatus | undefined;
  runId?: string | undefined;
  kind?: ApprovalKind | undefined;
  now: Date;
  after?: { created_at: string; id: string } | undefined;
  limit: number;
}

/**
 * Newest first, each with its status as of `now`: a pending proposal, or an approval unused, past
 * its time is expired — and is listed under `expired`, not `pending` or `approved`.
 */
export async function listApprovals(
  db: Kysely<DB>,
  query: ApprovalQuery,
): Promise<{ items: Approval[]; next: ApprovalQuery['after'] | null }> {
  let q = db
    .selectFrom('approvals')
    .selectAll()
    .select((eb) => lapsedAt(eb, query.now).as('lapsed'));
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.runId !== undefined) q = q.where('run_id', '=', query.runId);
  if (query.kind !== undefined) q = q.where('kind', '=', query.kind);
  if (query.status === 'pending') q = q.where('status', '=', 'pending').where('expires_at', '>', query.now);
  else if (query.status === 'approved')
    q = q.where('status', '=', 'approved').where((eb) => eb.not(lapsedAt(eb, query.now)));
  else if (query.status === 'expired') {
    q = q.where((eb) =>
      eb.or([
        eb('status', '=', 'expired'),
        eb.and([eb('status', '=', 'pending'), eb('expires_at', '<=', query.now)]),
        lapsedAt(eb, query.now),
      ]),
    );
  } else if (query.status !== undefined) q = q.where('status', '=', query.status);
  if (query.after)
    q = q.where(sql<boolean>`(created_at, id) < (${new Date(query.after.created_at)}, ${query.after.id})`);
  const rows = await q
    .orderBy('created_at', 'desc')
    .orderBy('id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map((row) => {
    const approval = toApproval(row);
    return { ...approval, status: approvalStatusAt(approval, query.now, Boolean(row.lapsed)) };
  });
  const last = items[items.length - 1];
  return {
    items,
    next: rows.length > query.limit && last ? { created_at: last.created_at.toISOString(), id: last.id } : null,
  };
}

/**
 * Approved, past `expires_at` and unused by `now`. A tool call's approval is used once a call it let through is on
 * record (its `approval_id` on `run.step.dispatching` or `run.step.failed`); a hand-off's as it is approved.
 */
function lapsedAt(eb: ExpressionBuilder<DB, 'approvals'>, now: Date) {
  const useOnRecord = eb
    .selectFrom('audit_events')
    .select('audit_events.seq')
    .whereRef('audit_events.run_id', '=', 'approvals.run_id')
    .whereRef('audit_events.tenant_id', '=', 'approvals.tenant_id')
    .where('audit_events.event_type', 'in', ['run.step.dispatching', 'run.step.failed'])
    .where(sql<boolean>`audit_events.details ->> 'approval_id' = approvals.id`);
  return eb.and([
    eb('approvals.status', '=', 'approved'),
    eb('approvals.kind', '=', 'tool_call'),
    eb('approvals.expires_at', '<=', now),
    eb.not(eb.exists(useOnRecord)),
  ]);
}

function toApproval(row: Selectable<ApprovalTable>): Approval {
  return {
    id: row.id,
    tenant_id: row.tenant_id,
    kind: row.kind as ApprovalKind,
    run_id: row.run_id,
    agent_id: row.agent_id,
    step_index: row.step_index,
    tool_id: row.tool_id,
    tool_version: row.tool_version,
    // jsonb arrives parsed (pg and PGlite alike); an input may itself be a JSON string.
    input: row.input,
    input_sha256: row.input_sha256,
    handoff_id: row.handoff_id,
    proposed_by: row.proposed_by,
    status: row.status as ApprovalStatus,
    created_at: new Date(row.created_at),
    expires_at: new Date(row.expires_at),
    decided_by: row.decided_by,
    decided_at: row.decided_at === null ? null : new Date(row.decided_at),
    rationale: row.rationale,
  };
}
