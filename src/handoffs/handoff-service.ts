import { randomBytes } from 'node:crypto';
import type { GrantsPort, GrantUsePort } from '../admission/ports.js';
import type { AgentPrincipal } from '../admission/step.js';
import { insertApproval } from '../runs/approval-repository.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { actorOf } from '../auth/principal.js';
import { holdRunUnits, lockRunAllowance } from '../budgets/run-allowance.js';
import type { CapabilityModifiers } from '../grants/grant.js';
import { attributionOf } from '../runs/run-lifecycle.js';
import { findRun, lockRun, type RunRecord } from '../runs/run-repository.js';
import { insertSubRun, markHandedOff } from '../runs/sub-run-repository.js';
import { isTerminal } from '../runs/run-types.js';
import { narrowestModifiers } from '../grants/authority-envelope.js';
import type { ApprovalRequirement, Handoff, HandoffRequest } from '../runs/handoff.js';
import { findHandoffOfSubRun, insertHandoff, listHandoffsFrom } from '../runs/handoff-repository.js';
import { checkHandoff, type ParentAuthority } from './handoff-validation.js';
import type { Database } from '../db/database.js';
import { changeInLockOrder } from '../db/lock-order.js';

/** What the hand-off service is built from, by the composition root. */
export interface HandoffServiceDeps {
  database: Database;
  grants: GrantsPort;
  grantUses: GrantUsePort;
  now: () => Date;
  /** A hand-off is refused once the trace root … parent is this long (`TOOLGATE_HANDOFF_MAX_DEPTH`, 5). */
  maxDepth: number;
  /** How many hand-offs a root run may make; a sub-run may make what its hand-off allows. */
  rootMaxFanout: number;
  approvalTtlMs: number;
}

/** Why a hand-off was not made; expected outcomes, not faults. */
export type HandoffRefusal = {
  ok: false;
  code: 'not_found' | 'run_not_resumable' | 'handoff_rejected' | 'run_id_conflict';
  message: string;
  details?: Record<string, unknown>;
};

/**
 * Hand-offs: a running agent gives a sub-agent's run part of its budget and a narrower authority. The parent's
 * authority is what it can use itself now (its envelope, its live grants), so a hand-off never widens anything.
 */
export class HandoffService {
  constructor(private readonly deps: HandoffServiceDeps) {}

  async create(
    agent: AgentPrincipal,
    parentRunId: string,
    request: HandoffRequest,
    traceId: string,
  ): Promise<{ ok: true; handoff: Handoff; approvalId: string | null } | HandoffRefusal> {
    const seen = await findRun(this.deps.database.control, agent.tenantId, parentRunId);
    if (!seen || seen.agent_id !== agent.id)
      return { ok: false, code: 'not_found', message: `run ${parentRunId} not found` };
    // An ended parent hands nothing on, and relies on no grant: its refusal is recorded below.
    const ended = isTerminal(seen.status);
    const envelope =
      !ended && seen.depth > 0
        ? await findHandoffOfSubRun(this.deps.database.control, seen.tenant_id, seen.run_id)
        : undefined;
    const tools = ended
      ? new Map<string, CapabilityModifiers>()
      : await this.handOnable(seen, request.delegable_tool_ids, envelope);
    const now = this.deps.now();
    const actor = actorOf(agent);

    return changeInLockOrder(this.deps.database.control, async (trx) => {
      const parent = await lockRun(trx, seen);
      if (!parent) return notResumable(seen);
      // Every refusal made here is on record: under the parent run, in this transaction.
      const refuse = async (refusal: HandoffRefusal): Promise<HandoffRefusal> => {
        await writeAuditEvents(trx, [
          {
            occurredAt: now,
            event: {
              event_type: 'handoff.rejected',
              actor,
              tenant_id: parent.tenant_id,
              agent_id: parent.agent_id,
              run_id: parent.run_id,
              trace_id: traceId,
              status: 'denied',
              reason_code: refusal.code,
              details: {
                ...refusal.details,
                message: refusal.message,
                sub_agent_id: request.sub_agent_id,
                sub_run_id: request.sub_run_id,
                attribution: attributionOf(parent),
              },
            },
          },
        ]);
        return refusal;
      };
      if (ended || isTerminal(parent.status)) return refuse(notResumable(parent));
      const made = await listHandoffsFrom(trx, parent.tenant_id, parent.run_id);
      const allowance =
        parent.budget_units === null
          ? null
          : await lockRunAllowance(trx, parent.tenant_id, parent.run_id, parent.budget_units);
      const authority: ParentAuthority = {
        trace: attributionOf(parent).map((a) => a.agent_id),
        tools,
        maxFanout: envelope?.max_fanout ?? this.deps.rootMaxFanout,
        handoffsMade: made.length,
        approvalRequirement: envelope?.approval_requirement ?? 'none',
        remainingUnits: allowance?.remaining_units ?? null,
      };
      const check = checkHandoff(request, authority, this.deps.maxDepth);
      if (!check.ok) {
        return refuse({
          ok: false,
          code: 'handoff_rejected',
          message: check.message,
          details: { reason: check.reason, ...check.details },
        });
      }
      const lineage = attributionOf(parent);
      const sub = await insertSubRun(trx, {
        tenant_id: parent.tenant_id,
        run_id: request.sub_run_id,
        agent_id: request.sub_agent_id,
        parent_run_id: parent.run_id,
        status: request.approval_requirement === 'none' ? 'queued' : 'awaiting_approval',
        depth: parent.depth + 1,
        lineage,
        budget_units: request.budget_units,
        trace_id: traceId,
        created_at: now,
      });
      if (!sub)
        return refuse({
          ok: false,
          code: 'run_id_conflict',
          message: `run_id ${request.sub_run_id} is already in use`,
          details: { sub_run_id: request.sub_run_id },
        });
      await markHandedOff(trx, parent);
      const handoff = await insertHandoff(trx, {
        id: `hof_${randomBytes(10).toString('hex')}`,
        tenant_id: parent.tenant_id,
        parent_run_id: parent.run_id,
        sub_run_id: sub.run_id,
        parent_agent_id: parent.agent_id,
        sub_agent_id: sub.agent_id,
        budget_units: request.budget_units,
        delegable_tool_ids: request.delegable_tool_ids,
        max_fanout: request.max_fanout,
        capability_modifiers: request.capability_modifiers,
        approval_requirement: request.approval_requirement,
        depth: sub.depth,
        created_at: now,
      });
      await holdRunUnits(trx, parent.tenant_id, parent.run_id, request.budget_units, now);
      const approval =
        request.approval_requirement === 'none'
          ? null
          : await insertApproval(trx, {
              id: `apr_${randomBytes(10).toString('hex')}`,
              tenant_id: parent.tenant_id,
              kind: 'handoff',
              run_id: sub.run_id,
              agent_id: sub.agent_id,
              step_index: null,
              tool_id: null,
              tool_version: null,
              input: null,
              input_sha256: null,
              handoff_id: handoff.id,
              proposed_by: actor,
              created_at: now,
              expires_at: new Date(now.getTime() + this.deps.approvalTtlMs),
            });
      const dispatched = {
        event_type: 'handoff.dispatched',
        actor,
        tenant_id: parent.tenant_id,
        agent_id: sub.agent_id,
        run_id: sub.run_id,
        trace_id: traceId,
        status: sub.status,
        cost_units: request.budget_units,
        details: { ...handoffDetails(handoff), approval_id: approval?.id ?? null, attribution: attributionOf(sub) },
      };
      // A hand-off waiting for an operator is a proposal on record, as a held call's is.
      const requested = approval && {
        event_type: 'approval.requested',
        actor,
        tenant_id: approval.tenant_id,
        agent_id: approval.agent_id,
        run_id: approval.run_id,
        trace_id: traceId,
        status: 'awaiting_approval',
        details: {
          approval_id: approval.id,
          handoff_id: handoff.id,
          proposed_by: approval.proposed_by,
          expires_at: approval.expires_at.toISOString(),
          attribution: attributionOf(sub),
        },
      };
      await writeAuditEvents(
        trx,
        [dispatched, ...(requested ? [requested] : [])].map((event) => ({ occurredAt: now, event })),
      );
      return { ok: true, handoff, approvalId: approval?.id ?? null } as const;
    });
  }

  list(tenantId: string, parentRunId: string): Promise<Handoff[]> {
    return listHandoffsFrom(this.deps.database.control, tenantId, parentRunId);
  }

  /**
   * The tools asked for that the parent can hand on (inside its envelope, backed by a live grant of its own), with the
   * modifiers its own calls run under. Their grants are recorded as relied on: pulling one stops everything handed on.
   */
  private async handOnable(
    parent: RunRecord,
    asked: readonly string[],
    envelope: Handoff | undefined,
  ): Promise<Map<string, CapabilityModifiers>> {
    const tools = new Map<string, CapabilityModifiers>();
    for (const toolId of new Set(asked)) {
      if (envelope && !envelope.delegable_tool_ids.includes(toolId)) continue;
      const resolved = await this.deps.grants.resolve({
        tenantId: parent.tenant_id,
        agentId: parent.agent_id,
        toolId,
        context: {
          tenant_id: parent.tenant_id,
          run_id: parent.run_id,
          pipeline_instance_id: parent.pipeline_instance_id ?? undefined,
          session_id: parent.session_id ?? undefined,
          user_id: parent.user_id ?? undefined,
        },
      });
      if (
        resolved.ok &&
        (await this.deps.grantUses.record({
          tenantId: parent.tenant_id,
          runId: parent.run_id,
          grantId: resolved.grant.id,
        }))
      ) {
        const own = resolved.grant.capability_modifiers;
        tools.set(toolId, envelope ? narrowestModifiers(own, envelope.capability_modifiers) : own);
      }
    }
    return tools;
  }
}

function notResumable(run: RunRecord): HandoffRefusal {
  return {
    ok: false,
    code: 'run_not_resumable',
    message: `run ${run.run_id} is ${run.status}; it hands nothing off`,
    details: { status: run.status },
  };
}

/** A hand-off as the API and its audit events show it. */
export function handoffDetails(handoff: Handoff) {
  return {
    handoff_id: handoff.id,
    parent_run_id: handoff.parent_run_id,
    sub_run_id: handoff.sub_run_id,
    sub_agent_id: handoff.sub_agent_id,
    budget_units: handoff.budget_units,
    delegable_tool_ids: handoff.delegable_tool_ids,
    max_fanout: handoff.max_fanout,
    capability_modifiers: handoff.capability_modifiers,
    approval_requirement: handoff.approval_requirement as ApprovalRequirement,
    depth: handoff.depth,
  };
}
