import type { Transaction } from 'kysely';
import type { AgentPrincipal } from '../admission/step.js';
import { approvalStatusAt, type Approval } from './approval.js';
import { findLatestApproval, findNextStepApproval } from './approval-repository.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { actorOf, type Principal } from '../auth/principal.js';
import type { DB } from '../db/schema.js';
import { CodedError } from '../errors/coded-error.js';
import type { RunExecutor } from './run-executor.js';
import type { RunAnswer } from './run-types.js';
import { attributionOf, endRunTrees } from './run-lifecycle.js';
import { writeRunAwaitingApproval, writeRunPaused, writeRunStatus } from './run-end-repository.js';
import { lockRun, type RunKey, type RunRecord } from './run-repository.js';
import { claimIdleRun } from './run-take-up-repository.js';
import { isTerminal, type LapsedApprovals, type RunEnvelope, type RunStatus, type Via } from './run-types.js';
import type { Database } from '../db/database.js';
import { changeInLockOrder, type ChainHeld } from '../db/lock-order.js';

/** What the run controls are built from, by the composition root. */
export interface RunControlDeps {
  database: Database;
  executor: RunExecutor;
  /** This replica: the executor id a take-up records. */
  replicaId: string;
  approvals: LapsedApprovals;
  now: () => Date;
}

/** The run controls, as `run.control_rejected` names them in `details.control`. */
export type RunControl = 'cancel' | 'kill' | 'pause' | 'resume' | 'complete';

/** A control's caller: the run's owning agent or an operator who may reach its tenant. */
export interface Controller {
  principal: Principal;
  traceId: string;
  /** The door the control came through when not the REST API. */
  via?: Via | undefined;
}

/**
 * Run controls (cancel, kill, pause, resume, complete; who may: docs/api.md#approvals-hand-offs-and-run-controls), each
 * audited in its transaction. An ended run refuses them, on record as `run.control_rejected`, with why it ended.
 */
export class RunControls {
  constructor(private readonly deps: RunControlDeps) {}

  cancel(caller: Controller, key: RunKey, reason: string | undefined): Promise<RunRecord> {
    return this.end(caller, key, 'cancel', 'cancelled', 'run.cancelled', reason);
  }

  kill(caller: Controller, key: RunKey, reason: string | undefined): Promise<RunRecord> {
    return this.end(caller, key, 'kill', 'killed', 'run.killed', reason);
  }

  /** Ends a run kept open (`keep_open`) whose plan is done; its open sub-runs are cancelled. */
  complete(caller: Controller, key: RunKey): Promise<RunRecord> {
    return this.change(caller, key, 'complete', async (trx, run) => {
      if (run.status !== 'running' || !run.keep_open || run.busy) {
        return new CodedError(
          'run_not_resumable',
          `run ${run.run_id} is not an open run at rest (it is ${run.status}${run.busy ? ', executing' : ''})`,
          { status: run.status },
        );
      }
      await endRunTrees(trx, this.ending(caller, run, 'completed', 'run.completed', undefined), this.deps.now());
    });
  }

  /** Pauses an open run: an executing one stops before its next call, the rest stay put. */
  pause(caller: Controller, key: RunKey, reason: string | undefined): Promise<RunRecord> {
    return this.change(caller, key, 'pause', async (trx, run) => {
      if (run.status === 'paused') return;
      await writeRunPaused(trx, run, run.busy ? null : pausedEnvelope(run));
      await this.record(trx, caller, run, 'run.paused', 'paused', {
        previous_status: run.status,
        reason: reason ?? null,
      });
    });
  }

  /**
   * Takes a waiting run up again and executes what is left of it in this request: every stage
   * runs again for every step, so a grant pulled, a switch armed or a budget spent meanwhile
   * stops it now. The answer is the run envelope, as `POST /runs/execute` gives it.
   */
  async resume(caller: Controller, key: RunKey): Promise<RunAnswer> {
    // Marked as executed here before it is taken up: a busy run of this replica that is not
    // marked would be taken for lost.
    const release = this.deps.executor.track(key);
    try {
      return await this.resumeTracked(caller, key);
    } finally {
      release();
    }
  }

  private async resumeTracked(caller: Controller, key: RunKey): Promise<RunAnswer> {
    const now = this.deps.now();
    const outcome = await changeInLockOrder(
      this.deps.database.control,
      async (trx): Promise<{ run: RunRecord } | { answer: RunAnswer } | { refuse: CodedError }> => {
        const run = await this.lockOwned(trx, caller, key);
        const reject = (error: CodedError) => this.reject(trx, caller, run, 'resume', error);
        if (isTerminal(run.status)) return reject(stoppedError(run));
        const agent = caller.principal.kind === 'agent';
        switch (run.status) {
          case 'paused': {
            if (agent) {
              // Undoing an operator's pause is an operator's power: the attempt is on record.
              await this.record(
                trx,
                caller,
                run,
                'security.escalation_attempt',
                'denied',
                { control: 'resume', run_status: run.status },
                'agent_forbidden',
              );
              return {
                refuse: new CodedError('agent_forbidden', 'a paused run is resumed by an operator', {
                  status: run.status,
                }),
              };
            }
            if (run.busy)
              return reject(
                new CodedError('run_not_resumable', `run ${run.run_id} is still stopping at its next call; try again`, {
                  status: run.status,
                  reason: 'still_stopping',
                }),
              );
            if (!run.request) {
              // Never started: back to waiting for its agent (or for its hand-off's approval).
              const handoffApproval = await findLatestApproval(trx, run.tenant_id, run.run_id, null);
              const lapsed = await this.expireLapsed(trx, caller, handoffApproval, now);
              if (lapsed) return { refuse: lapsed };
              const status: RunStatus =
                handoffApproval && approvalStatusAt(handoffApproval, now) === 'pending'
                  ? 'awaiting_approval'
                  : 'queued';
              await writeRunStatus(trx, run, status);
              await this.record(trx, caller, run, 'run.resumed', status, { previous_status: run.status });
              return {
                answer: {
                  httpStatus: 202,
                  envelope: { run_id: run.run_id, status, dry_run: false, steps: [], warnings: [] },
                  replayed: false,
                },
              };
            }
            const approval = await findNextStepApproval(trx, run);
            const lapsed = await this.expireLapsed(trx, caller, approval, now);
            if (lapsed) return { refuse: lapsed };
            if (approval && approvalStatusAt(approval, now) === 'pending') {
              // Paused while it waited for an operator: it waits again for the same proposal, which
              // an operator may be about to approve (proposing anew would withdraw it, and make the
              // call the resuming operator's proposal, which that operator could not approve).
              const envelope = awaitingEnvelope(run, approval);
              await writeRunAwaitingApproval(trx, run, envelope);
              await this.record(trx, caller, run, 'run.resumed', 'awaiting_approval', {
                previous_status: run.status,
                approval_id: approval.id,
              });
              return { answer: { httpStatus: 202, envelope, replayed: false } };
            }
            break;
          }
          case 'awaiting_approval': {
            if (!run.request) {
              const lapsed = await this.expireLapsed(
                trx,
                caller,
                await findLatestApproval(trx, run.tenant_id, run.run_id, null),
                now,
              );
              if (lapsed) return { refuse: lapsed };
              return reject(
                new CodedError('run_not_resumable', `run ${run.run_id} waits for an operator to approve its hand-off`, {
                  status: run.status,
                  reason: 'handoff_awaiting_approval',
                }),
              );
            }
            const step = (run.envelope?.steps ?? []).find((s) => s.status === 'awaiting_approval');
            const approval = step ? await findLatestApproval(trx, run.tenant_id, run.run_id, step.index) : undefined;
            if (!approval)
              return reject(
                new CodedError('run_not_resumable', `run ${run.run_id} has no approval to resume with`, {
                  status: run.status,
                }),
              );
            const lapsed = await this.expireLapsed(trx, caller, approval, now);
            if (lapsed) return { refuse: lapsed };
            const status = approvalStatusAt(approval, now);
            if (status !== 'approved') {
              return reject(
                new CodedError('run_not_resumable', `approval ${approval.id} is ${status}`, {
                  approval_id: approval.id,
                  approval_status: status,
                }),
              );
            }
            break;
          }
          case 'throttled': {
            const lapsed = await this.expireLapsed(trx, caller, await findNextStepApproval(trx, run), now);
            if (lapsed) return { refuse: lapsed };
            break;
          }
          default:
            return reject(
              new CodedError('run_not_resumable', `run ${run.run_id} is ${run.status}; there is nothing to resume`, {
                status: run.status,
              }),
            );
        }
        const taken = await claimIdleRun(trx, run, [run.status], this.deps.replicaId);
        if (!taken)
          return reject(
            new CodedError('run_not_resumable', `run ${run.run_id} is being resumed already`, { status: run.status }),
          );
        await this.record(trx, caller, run, 'run.resumed', 'running', { previous_status: run.status });
        return { run: taken };
      },
    );
    if ('refuse' in outcome) throw outcome.refuse;
    if ('answer' in outcome) return outcome.answer;
    const principal = caller.principal.kind === 'agent' ? caller.principal : ownerOf(outcome.run);
    return this.deps.executor.continueRun(
      outcome.run,
      principal,
      caller.traceId,
      actorOf(caller.principal),
      caller.via,
    );
  }

  /** Expires the approval a waiting run would go on with if it lapsed (see `ApprovalService.expireLapsed`); the refusal, if so. */
  private async expireLapsed(
    trx: Transaction<DB>,
    caller: Controller,
    approval: Approval | undefined,
    now: Date,
  ): Promise<CodedError | undefined> {
    const lapsed = await this.deps.approvals.expireLapsed(
      trx,
      approval,
      actorOf(caller.principal),
      now,
      caller.traceId,
    );
    return lapsed && new CodedError(lapsed.code, lapsed.message, lapsed.details);
  }

  private end(
    caller: Controller,
    key: RunKey,
    control: RunControl,
    status: 'cancelled' | 'killed',
    eventType: string,
    reason: string | undefined,
  ): Promise<RunRecord> {
    return this.change(caller, key, control, async (trx, run) => {
      await endRunTrees(trx, this.ending(caller, run, status, eventType, reason), this.deps.now());
    });
  }

  private ending(
    caller: Controller,
    run: RunRecord,
    status: 'cancelled' | 'killed' | 'completed',
    eventType: string,
    reason: string | undefined,
  ) {
    const actor = actorOf(caller.principal);
    const control = eventType.replace('run.', '');
    return {
      roots: [run],
      status,
      stop: {
        code: 'run_not_resumable' as const,
        message: `${control} by ${actor}`,
        details: { control, by: actor, reason: reason ?? null },
      },
      eventType,
      actor,
      traceId: caller.traceId,
    };
  }

  /**
   * Locks the caller's run, refuses an ended one, applies the change (which may refuse it
   * before changing anything), and answers the run as it is now. A refusal is recorded and
   * committed before it is thrown.
   */
  private async change(
    caller: Controller,
    key: RunKey,
    control: RunControl,
    apply: (trx: Transaction<DB>, run: RunRecord) => Promise<CodedError | void>,
  ): Promise<RunRecord> {
    const outcome = await changeInLockOrder(
      this.deps.database.control,
      async (trx): Promise<{ run: RunRecord } | { refuse: CodedError }> => {
        const run = await this.lockOwned(trx, caller, key);
        const refusal = isTerminal(run.status) ? stoppedError(run) : await apply(trx, run);
        if (refusal) return this.reject(trx, caller, run, control, refusal);
        return { run: (await lockRun(trx, key))! };
      },
    );
    if ('refuse' in outcome) throw outcome.refuse;
    return outcome.run;
  }

  /**
   * A control refused for the state of a run the caller may see, on record as every denial is:
   * `run.control_rejected`, `denied`, the answer's code, details and message, in the
   * transaction that decided it — so a refusal that cannot be recorded is no answer (503).
   */
  private async reject(
    trx: Transaction<DB>,
    caller: Controller,
    run: RunRecord,
    control: RunControl,
    error: CodedError,
  ): Promise<{ refuse: CodedError }> {
    await this.record(
      trx,
      caller,
      run,
      'run.control_rejected',
      'denied',
      { ...error.details, message: error.message, control },
      error.code,
    );
    return { refuse: error };
  }

  /** The run, if the caller may act on it: an agent only on its own (others' do not exist for it). */
  private async lockOwned(trx: ChainHeld, caller: Controller, key: RunKey): Promise<RunRecord> {
    const run = await lockRun(trx, key);
    if (!run || (caller.principal.kind === 'agent' && run.agent_id !== caller.principal.id)) {
      throw new CodedError('not_found', `run ${key.run_id} not found`);
    }
    return run;
  }

  private async record(
    trx: Transaction<DB>,
    caller: Controller,
    run: RunRecord,
    eventType: string,
    status: string,
    details: Record<string, unknown>,
    reasonCode: string | null = null,
  ): Promise<void> {
    await writeAuditEvents(trx, [
      {
        occurredAt: this.deps.now(),
        event: {
          event_type: eventType,
          actor: actorOf(caller.principal),
          tenant_id: run.tenant_id,
          agent_id: run.agent_id,
          run_id: run.run_id,
          trace_id: caller.traceId,
          status,
          reason_code: reasonCode,
          details: {
            ...details,
            run_depth: run.depth,
            attribution: attributionOf(run),
            ...(caller.via ? { via: caller.via } : {}),
          },
        },
      },
    ]);
  }
}

/** The owning agent as the run recorded it: who an operator's resume executes as. */
function ownerOf(run: RunRecord): AgentPrincipal {
  return {
    kind: 'agent',
    id: run.agent_id,
    tenantId: run.tenant_id,
    family: run.agent_family ?? undefined,
    scopes: new Set(run.agent_scopes),
  };
}

/** The refusal for a run that has ended: the reason a cascade stopped it, else `run_not_resumable`. */
function stoppedError(run: RunRecord): CodedError {
  const stop = run.stop;
  if (stop && stop.code !== 'run_not_resumable') {
    return new CodedError(stop.code, stop.message, { ...stop.details, run_id: run.run_id, status: run.status });
  }
  return new CodedError('run_not_resumable', `run ${run.run_id} is ${run.status}`, {
    run_id: run.run_id,
    status: run.status,
    ...(stop ? { stop: stop.details } : {}),
  });
}

/**
 * A run paused while nothing executed it: what it has not completed is pending again. A step that
 * waited for an approval keeps it (and its record): the proposal stays live while the run is paused.
 */
function pausedEnvelope(run: RunRecord): RunEnvelope {
  const stored = run.envelope?.steps ?? [];
  const done = stored.findIndex((step) => step.status !== 'completed');
  const steps = stored.map((step, index) => {
    if (done === -1 || index < done) return step;
    const pending = {
      index: step.index,
      tool_id: step.tool_id,
      version: step.version,
      status: 'pending' as const,
      cost_units: 0,
      duration_ms: 0,
      audit_id: null,
    };
    return step.status === 'awaiting_approval' && step.approval_id !== undefined
      ? { ...pending, audit_id: step.audit_id, approval_id: step.approval_id }
      : pending;
  });
  return { run_id: run.run_id, status: 'paused', dry_run: false, steps, warnings: run.envelope?.warnings ?? [] };
}

/** A paused run back to waiting for its step's pending proposal; later steps stay pending. */
function awaitingEnvelope(run: RunRecord, approval: Approval): RunEnvelope {
  const steps = (run.envelope?.steps ?? []).map((step) =>
    step.index === approval.step_index
      ? { ...step, status: 'awaiting_approval' as const, version: approval.tool_version, approval_id: approval.id }
      : step,
  );
  return {
    run_id: run.run_id,
    status: 'awaiting_approval',
    dry_run: false,
    steps,
    warnings: run.envelope?.warnings ?? [],
  };
}
