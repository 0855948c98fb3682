import type { Transaction } from 'kysely';
import { cancelPendingApprovals } from './approval-repository.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { returnSubRunAllowances } from '../budgets/run-allowance.js';
import type { DB } from '../db/schema.js';
import { closeHandoff, findOpenHandoffsOfSubRuns } from './handoff-repository.js';
import { statusForCode, type ErrorCode } from '../errors/error-codes.js';
import { writeRunEnd } from './run-end-repository.js';
import { lockOpenRunTrees, type RunKey, type RunRecord } from './run-repository.js';
import type { Attribution, RunEnvelope, RunStop, StepResult, TerminalStatus } from './run-types.js';
import { holdAuditChain, type ChainHeld } from '../db/lock-order.js';

/**
 * How runs end when something other than their plan ends them: open sub-runs end too, proposals are withdrawn, a
 * sub-run's hand-off gives back what it did not use; audited with cascade depth. Locks: docs/design/lock-order.md.
 */

/** What ends the runs given as roots. */
export interface RunEnd {
  roots: RunKey[];
  status: TerminalStatus;
  stop: Omit<RunStop, 'audit_id'>;
  /** The event recorded for each root: `run.cancelled`, `run.killed`, `run.stopped`, `run.completed`. */
  eventType: string;
  actor: string;
  traceId?: string | null | undefined;
}

/** A run a control or cascade ended, and how far down the cascade it was. */
export interface EndedRun extends RunKey {
  agent_id: string;
  status: TerminalStatus;
  previous_status: string;
  cascade_depth: number;
  audit_id: string;
}

/** Codes that say why governance stopped a run; sub-runs that end with it are told the same. */
const GOVERNANCE_CODES: ReadonlySet<ErrorCode> = new Set([
  'grant_revoked',
  'grant_expired',
  'kill_switch_active',
  'budget_exceeded',
]);

/** The chain a run's events carry: its ancestors and itself, root first. */
export function attributionOf(run: Pick<RunRecord, 'run_id' | 'agent_id' | 'lineage'>): Attribution[] {
  return [...run.lineage, { run_id: run.run_id, agent_id: run.agent_id }];
}

/** Ends the open runs among `end.roots` and every open run below them, in one transaction. */
export async function endRunTrees(cause: Transaction<DB>, end: RunEnd, at: Date): Promise<EndedRun[]> {
  const trx = await holdAuditChain(cause);
  const runs = await lockOpenRunTrees(trx, end.roots);
  return applyEnds(trx, runs, new Set(end.roots.map(keyOf)), end, at);
}

/**
 * What follows when a run's own executor moved it to a terminal status: its open sub-runs end
 * (`run.stopped`, cascade depth from 1) and, if it is a sub-run, its hand-off closes.
 */
export async function followRunEnd(
  trx: ChainHeld,
  ended: RunRecord & { status: TerminalStatus },
  actor: string,
  at: Date,
): Promise<EndedRun[]> {
  const below = await lockOpenRunTrees(trx, [ended]);
  const code: ErrorCode = ended.stop && GOVERNANCE_CODES.has(ended.stop.code) ? ended.stop.code : 'run_not_resumable';
  const end: RunEnd = {
    roots: [],
    status: ended.status,
    stop: {
      code,
      message: `parent run ${ended.run_id} ended ${ended.status}`,
      details: { parent_status: ended.status },
    },
    eventType: 'run.stopped',
    actor,
  };
  return applyEnds(trx, below, new Set(), end, at, ended);
}

async function applyEnds(
  trx: ChainHeld,
  runs: RunRecord[],
  roots: ReadonlySet<string>,
  end: RunEnd,
  at: Date,
  alreadyEnded?: RunRecord,
): Promise<EndedRun[]> {
  const depths = cascadeDepths(runs, roots, alreadyEnded);
  const ordered = [...runs].sort(
    (a, b) => depths.get(keyOf(a))! - depths.get(keyOf(b))! || (keyOf(a) < keyOf(b) ? -1 : 1),
  );
  const plans = ordered.map((run) => {
    const isRoot = roots.has(keyOf(run));
    const depth = depths.get(keyOf(run))!;
    const governance = GOVERNANCE_CODES.has(end.stop.code);
    // Below the roots, runs share a governance stop (killed, or failed for a pulled grant);
    // otherwise their parent simply ended, and they are cancelled.
    const status: TerminalStatus =
      isRoot || end.status === 'killed' || (governance && end.status === 'failed') ? end.status : 'cancelled';
    const code: ErrorCode = isRoot || governance ? end.stop.code : 'run_not_resumable';
    const details = {
      ...end.stop.details,
      cascade_depth: depth,
      previous_status: run.status,
      ...(isRoot ? {} : { via_run_id: run.parent_run_id }),
    };
    const message = isRoot ? end.stop.message : `${end.stop.message} (cascade from run ${run.parent_run_id})`;
    return { run, isRoot, depth, status, stop: { code, message, details } };
  });

  await cancelPendingApprovals(trx, [...runs, ...(alreadyEnded ? [alreadyEnded] : [])]);
  const handoffs = (await findOpenHandoffsOfSubRuns(trx, [...runs, ...(alreadyEnded ? [alreadyEnded] : [])])).sort(
    (a, b) => b.depth - a.depth,
  );
  const returns = await returnSubRunAllowances(
    trx,
    handoffs.map((h) => ({
      tenantId: h.tenant_id,
      parentRunId: h.parent_run_id,
      subRunId: h.sub_run_id,
      heldUnits: h.budget_units,
    })),
    at,
  );
  for (const [i, handoff] of handoffs.entries()) {
    await closeHandoff(trx, handoff.id, {
      spentUnits: returns[i]!.usedUnits,
      returnedUnits: returns[i]!.returnedUnits,
      at,
    });
  }

  const byKey = new Map([...runs, ...(alreadyEnded ? [alreadyEnded] : [])].map((run) => [keyOf(run), run]));
  const statusOf = (key: string) =>
    plans.find((p) => keyOf(p.run) === key)?.status ?? alreadyEnded?.status ?? end.status;
  const events: AuditEventInput[] = [
    ...plans.map((plan) => ({
      event_type: plan.isRoot ? end.eventType : 'run.stopped',
      actor: end.actor,
      tenant_id: plan.run.tenant_id,
      agent_id: plan.run.agent_id,
      run_id: plan.run.run_id,
      trace_id: end.traceId ?? null,
      status: plan.status,
      reason_code: plan.status === 'completed' ? null : plan.stop.code,
      details: {
        ...plan.stop.details,
        message: plan.stop.message,
        run_depth: plan.run.depth,
        attribution: attributionOf(plan.run),
      },
    })),
    ...handoffs.map((handoff, i) => {
      const sub = byKey.get(`${handoff.tenant_id}/${handoff.sub_run_id}`);
      return {
        event_type: 'handoff.closed',
        actor: end.actor,
        tenant_id: handoff.tenant_id,
        agent_id: handoff.sub_agent_id,
        run_id: handoff.sub_run_id,
        trace_id: end.traceId ?? null,
        status: statusOf(`${handoff.tenant_id}/${handoff.sub_run_id}`),
        cost_units: returns[i]!.usedUnits,
        details: {
          handoff_id: handoff.id,
          parent_run_id: handoff.parent_run_id,
          budget_units: handoff.budget_units,
          spent_units: returns[i]!.usedUnits,
          returned_units: returns[i]!.returnedUnits,
          overshoot_units: returns[i]!.overshootUnits,
          attribution: sub ? attributionOf(sub) : [],
        },
      };
    }),
  ];
  const records = await writeAuditEvents(
    trx,
    events.map((event) => ({ event, occurredAt: at })),
  );

  const ended: EndedRun[] = [];
  for (const [i, plan] of plans.entries()) {
    const stop: RunStop = { ...plan.stop, audit_id: records[i]!.event_id };
    await writeRunEnd(trx, plan.run, {
      status: plan.status,
      stop,
      httpStatus: plan.status === 'completed' ? 200 : statusForCode(stop.code),
      envelope: closedEnvelope(plan.run, plan.status, stop),
    });
    ended.push({
      tenant_id: plan.run.tenant_id,
      run_id: plan.run.run_id,
      agent_id: plan.run.agent_id,
      status: plan.status,
      previous_status: plan.run.status,
      cascade_depth: plan.depth,
      audit_id: stop.audit_id!,
    });
  }
  return ended;
}

/**
 * Hand-off hops from the nearest root (or from the run that already ended, whose sub-runs are at
 * depth 1). Runs whose parent is not in the set are roots reached directly.
 */
function cascadeDepths(
  runs: RunRecord[],
  roots: ReadonlySet<string>,
  alreadyEnded: RunRecord | undefined,
): Map<string, number> {
  const depths = new Map<string, number>();
  const byKey = new Map(runs.map((run) => [keyOf(run), run]));
  const depthOf = (run: RunRecord, seen: Set<string>): number => {
    const key = keyOf(run);
    const known = depths.get(key);
    if (known !== undefined) return known;
    let depth = 0;
    if (!roots.has(key) && run.parent_run_id !== null && !seen.has(key)) {
      const parentKey = `${run.tenant_id}/${run.parent_run_id}`;
      const parent = byKey.get(parentKey);
      if (parent) depth = depthOf(parent, seen.add(key)) + 1;
      else if (alreadyEnded && keyOf(alreadyEnded) === parentKey) depth = 1;
    }
    depths.set(key, depth);
    return depth;
  };
  for (const run of runs) depthOf(run, new Set());
  return depths;
}

/**
 * The stored envelope of a run that ended while not executing: the step it waited at is refused with the stop, the
 * later ones skipped. (An executing run gets its envelope from its executor, at its next call boundary.)
 */
export function closedEnvelope(
  run: Pick<RunRecord, 'run_id' | 'envelope'>,
  status: TerminalStatus,
  stop: RunStop,
): RunEnvelope {
  const previous = run.envelope;
  const waiting = (step: StepResult) =>
    step.status === 'pending' ||
    step.status === 'awaiting_approval' ||
    (previous?.status === 'throttled' && step.status === 'denied' && step.error?.code === 'rate_limited');
  let refused = false;
  const steps: StepResult[] = (previous?.steps ?? []).map((step) => {
    if (!waiting(step)) return step;
    const { approval_id: _approval, ...rest } = step;
    if (refused) return { ...rest, status: 'skipped' };
    refused = true;
    return {
      ...rest,
      status: 'denied',
      error: { code: stop.code, message: stop.message, details: stop.details },
      audit_id: stop.audit_id,
    };
  });
  return { run_id: run.run_id, status, dry_run: false, steps, warnings: previous?.warnings ?? [] };
}

function keyOf(run: RunKey): string {
  return `${run.tenant_id}/${run.run_id}`;
}
