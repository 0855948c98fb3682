import type { Kysely, Transaction } from 'kysely';
import type { ApprovalPort } from '../admission/ports.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { sameActor, type OperatorRole } from '../auth/principal.js';
import type { DB } from '../db/schema.js';
import { endRunTrees } from '../runs/run-lifecycle.js';
import { lockRun } from '../runs/run-repository.js';
import { releaseApprovedSubRun } from '../runs/sub-run-repository.js';
import {
  approvalStatusAt,
  approvalUsableAt,
  callSha256,
  type Approval,
  type ApprovalStatus,
  type ExactCall,
} from '../runs/approval.js';
import {
  decideApproval,
  findApproval,
  findLatestApproval,
  findOpenCallApproval,
  isApprovalLapsed,
  listApprovals,
  lockApproval,
  type ApprovalQuery,
} from '../runs/approval-repository.js';
import type { Database } from '../db/database.js';
import { changeInLockOrder } from '../db/lock-order.js';

/** What the approval service is built from, by the composition root. */
export interface ApprovalServiceDeps {
  database: Database;
  now: () => Date;
}

/** An operator deciding. Agents never reach approvals: the routes are operators'. */
export interface Approver {
  actor: string;
  role: OperatorRole;
}

/** Why a decision was not recorded; expected outcomes, not faults. */
export type ApprovalRefusal = {
  ok: false;
  code: 'not_found' | 'forbidden' | 'run_not_resumable';
  message: string;
  details?: Record<string, unknown>;
};

/**
 * Human approvals: the proposals of stage 8 and of hand-offs, and their decisions, each audited in its transaction. No
 * proposer decides its own: agents cannot reach these routes, nor can the operator whose request made the proposal.
 */
export class ApprovalService implements ApprovalPort {
  constructor(private readonly deps: ApprovalServiceDeps) {}

  async approvedFor(query: Parameters<ApprovalPort['approvedFor']>[0]): Promise<{ approvalId: string } | undefined> {
    const approval = await findLatestApproval(this.deps.database.control, query.tenantId, query.runId, query.stepIndex);
    if (!approval || !approvalUsableAt(approval, this.deps.now())) return undefined;
    const exact =
      approval.tool_id === query.toolId &&
      approval.tool_version === query.toolVersion &&
      approval.input_sha256 === query.inputSha256;
    return exact ? { approvalId: approval.id } : undefined;
  }

  /**
   * The approval an agent's exact call may go on with whatever its run (SPEC §12.1): pending (the call is answered with
   * it) or approved and unused (the call resumes its run); undefined when there is none.
   */
  openForCall(query: { tenantId: string; agentId: string; call: ExactCall }): Promise<Approval | undefined> {
    return findOpenCallApproval(this.deps.database.control, {
      tenantId: query.tenantId,
      agentId: query.agentId,
      callSha256: callSha256(query.call),
      now: this.deps.now(),
    });
  }

  /** An approval with its status as of now: a pending proposal, or an approval unused, past its time is expired. */
  async get(id: string): Promise<Approval | undefined> {
    const approval = await findApproval(this.deps.database.control, id);
    if (!approval) return undefined;
    const now = this.deps.now();
    return { ...approval, status: await statusAt(this.deps.database.control, approval, now) };
  }

  /** A page of approvals, each with its status as of now (as `get` gives it). */
  list(query: Omit<ApprovalQuery, 'now'>): ReturnType<typeof listApprovals> {
    return listApprovals(this.deps.database.control, { ...query, now: this.deps.now() });
  }

  /**
   * Approves (the run may resume, or the sub-run start) or rejects (the run is cancelled) a pending proposal. A
   * proposal, or an approval left unused, past its time expires instead, and its run is cancelled.
   */
  async decide(request: {
    id: string;
    approve: boolean;
    approver: Approver;
    rationale: string;
    traceId: string;
  }): Promise<{ ok: true; approval: Approval } | ApprovalRefusal> {
    const seen = await findApproval(this.deps.database.control, request.id);
    if (!seen) return { ok: false, code: 'not_found', message: `approval ${request.id} not found` };
    const now = this.deps.now();
    return changeInLockOrder(this.deps.database.control, async (trx) => {
      const run = await lockRun(trx, { tenant_id: seen.tenant_id, run_id: seen.run_id });
      const approval = await lockApproval(trx, request.id);
      if (!run || !approval)
        return { ok: false, code: 'not_found', message: `approval ${request.id} not found` } as const;
      const status = await statusAt(trx, approval, now);
      const event = approvalEvent(approval, request.approver.actor, request.traceId);
      if (status === 'expired' && approval.status !== 'expired') {
        await this.expire(trx, approval, request.approver.actor, now, request.traceId);
        return {
          ok: false,
          code: 'run_not_resumable',
          message: `approval ${approval.id} expired at ${approval.expires_at.toISOString()}`,
          details: { approval_status: 'expired' },
        } as const;
      }
      if (status !== 'pending') {
        return {
          ok: false,
          code: 'run_not_resumable',
          message: `approval ${approval.id} is ${status}`,
          details: { approval_status: status },
        } as const;
      }
      if (request.approve && sameActor(approval.proposed_by, request.approver.actor)) {
        await writeAuditEvents(trx, [
          {
            occurredAt: now,
            event: {
              ...event,
              event_type: 'security.self_approval_attempt',
              status: 'denied',
              reason_code: 'forbidden',
            },
          },
        ]);
        return {
          ok: false,
          code: 'forbidden',
          message: 'the proposer of an action cannot approve it',
          details: { proposed_by: approval.proposed_by },
        } as const;
      }
      const decided = await decideApproval(trx, approval.id, {
        status: request.approve ? 'approved' : 'rejected',
        decidedBy: request.approver.actor,
        rationale: request.rationale,
        at: now,
      });
      if (!decided) throw new Error(`approval ${approval.id} changed under its row lock`);
      await writeAuditEvents(trx, [
        {
          occurredAt: now,
          event: {
            ...event,
            event_type: request.approve ? 'approval.approved' : 'approval.rejected',
            status: decided.status,
            details: { ...event.details, rationale: request.rationale, actor_role: request.approver.role },
          },
        },
      ]);
      if (request.approve && approval.kind === 'handoff') await releaseApprovedSubRun(trx, run);
      if (!request.approve) {
        await endRunTrees(
          trx,
          {
            roots: [run],
            status: 'cancelled',
            stop: {
              code: 'run_not_resumable',
              message: `the proposed action was rejected by ${request.approver.actor}`,
              details: { reason: 'approval_rejected', approval_id: approval.id },
            },
            eventType: 'run.cancelled',
            actor: request.approver.actor,
            traceId: request.traceId,
          },
          now,
        );
      }
      return { ok: true, approval: decided } as const;
    });
  }

  /**
   * Expires the approval a waiting run would go on with once past its time (undecided, or approved but unused) and
   * cancels the run: answers the refusal, undefined while it holds. The caller holds the chain's lock and the run's.
   */
  async expireLapsed(
    trx: Transaction<DB>,
    approval: Approval | undefined,
    actor: string,
    now: Date,
    traceId: string | null,
  ): Promise<ApprovalRefusal | undefined> {
    if (!approval || approvalStatusAt(approval, now, approval.kind === 'tool_call') !== 'expired') return undefined;
    await this.expire(trx, approval, actor, now, traceId);
    return {
      ok: false,
      code: 'run_not_resumable',
      message: `approval ${approval.id} expired; the run was cancelled`,
      details: { approval_id: approval.id, approval_status: 'expired' },
    };
  }

  /**
   * A proposal, or an approval, that outlived `expires_at`: it is recorded as expired and its
   * run is cancelled (waiting on it could never end). Used by decisions and by resume.
   */
  async expire(
    trx: Transaction<DB>,
    approval: Approval,
    actor: string,
    now: Date,
    traceId: string | null,
  ): Promise<void> {
    const expired = await decideApproval(trx, approval.id, { status: 'expired', at: now });
    if (!expired) return;
    await writeAuditEvents(trx, [
      {
        occurredAt: now,
        event: {
          ...approvalEvent(approval, 'system.expiry', traceId),
          event_type: 'approval.expired',
          status: 'expired',
          details: { ...approvalEvent(approval, actor, traceId).details, noticed_by: actor },
        },
      },
    ]);
    await endRunTrees(
      trx,
      {
        roots: [{ tenant_id: approval.tenant_id, run_id: approval.run_id }],
        status: 'cancelled',
        stop: {
          code: 'run_not_resumable',
          message: `approval ${approval.id} expired before it was used`,
          details: { reason: 'approval_expired', approval_id: approval.id },
        },
        eventType: 'run.cancelled',
        actor: 'system.expiry',
        traceId,
      },
      now,
    );
  }
}

/** An approval's status as of `now`, looking up whether an approved one past its time was used. */
async function statusAt(db: Kysely<DB> | Transaction<DB>, approval: Approval, now: Date): Promise<ApprovalStatus> {
  const unused =
    approval.status === 'approved' &&
    !approvalUsableAt(approval, now) &&
    (await isApprovalLapsed(db, approval.id, now));
  return approvalStatusAt(approval, now, unused);
}

function approvalEvent(approval: Approval, actor: string, traceId: string | null) {
  return {
    event_type: 'approval',
    actor,
    tenant_id: approval.tenant_id,
    agent_id: approval.agent_id,
    run_id: approval.run_id,
    tool_id: approval.tool_id,
    tool_version: approval.tool_version,
    input_sha256: approval.input_sha256,
    trace_id: traceId,
    details: {
      approval_id: approval.id,
      kind: approval.kind,
      step_index: approval.step_index,
      handoff_id: approval.handoff_id,
      proposed_by: approval.proposed_by,
    } as Record<string, unknown>,
  };
}
