import { randomBytes, randomUUID } from 'node:crypto';
import type { Kysely } from 'kysely';
import { admitStep, type Admission } from '../admission/admission-pipeline.js';
import type { AdmissibleTool, AdmissionPorts, Denial, GrantPrefetch, Hold, Reservation } from '../admission/ports.js';
import { grantQueryOf } from '../admission/stages/04-grant.js';
import type { AgentPrincipal, StepRequest } from '../admission/step.js';
import { approvalStatusAt, type Approval } from './approval.js';
import {
  cancelPendingApprovals,
  findLatestApproval,
  findNextStepApproval,
  insertApproval,
} from './approval-repository.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { payloadHash } from '../audit/audit-hash.js';
import type { AuditLog } from '../audit/audit-log.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { actorOf } from '../auth/principal.js';
import { readRunUsage } from '../budgets/run-allowance.js';
import { MAX_UNITS } from '../budgets/budget-units.js';
import { GroupCommit, retryOnConflict } from '../db/group-commit.js';
import { jsonProblem } from '../db/json-limits.js';
import type { DB } from '../db/schema.js';
import type { Handoff } from './handoff.js';
import { findHandoffOfSubRun } from './handoff-repository.js';
import { CodedError } from '../errors/coded-error.js';
import { statusForCode, type ErrorCode } from '../errors/error-codes.js';
import type { Metrics } from '../metrics/metrics.js';
import type { BackendClient } from '../proxy/backend-client.js';
import { attributionOf, followRunEnd } from './run-lifecycle.js';
import type { RunRecovery } from './run-recovery.js';
import {
  claimRuns,
  findRun,
  releaseRun,
  lockRun,
  endRuns,
  readRunStanding,
  readRunStandingSettled,
  resumeThrottledRun,
  startQueuedRun,
  type NewRun,
  type RunEnding,
  type RunRecord,
  type RunStart,
} from './run-repository.js';
import {
  isTerminal,
  newToolCallId,
  statusAfter,
  type LapsedApprovals,
  type RunEnvelope,
  type RunRequest,
  type RunStatus,
  type RunStop,
  type StepResult,
  type TerminalStatus,
  type Via,
} from './run-types.js';
import type { Database } from '../db/database.js';
import { changeInLockOrder } from '../db/lock-order.js';

/** What the executor is built from, by the composition root. */
export interface RunExecutorDeps {
  database: Database;
  audit: AuditLog;
  ports: AdmissionPorts;
  backend: BackendClient;
  metrics: Metrics;
  now: () => Date;
  /** How long a proposed action waits for an operator, and an approval for its use. */
  approvalTtlMs: number;
  /** What expires an approval that lapsed while its run was throttled. */
  approvals: LapsedApprovals;
  /** This replica: the executor id its claims and take-ups record. */
  replicaId: string;
  /** Which runs this replica executes; ends the busy runs whose executor was lost. */
  recovery: RunRecovery;
  /** This replica's lease: while it may have lapsed, nothing is dispatched. */
  lease: { valid(): boolean };
}

/** What `POST /runs/execute` answers: the HTTP status of the step that stopped the run, and the envelope. */
export interface RunAnswer {
  httpStatus: number;
  envelope: RunEnvelope;
  replayed: boolean;
}

/** Denials that are security events (SPEC §8) are recorded under their own event type. */
const SECURITY_DENIALS: Partial<Record<ErrorCode, string>> = {
  tool_category_blocked: 'security.category_blocked',
  unauthorized_tool_access: 'security.unauthorized_tool_access',
  egress_denied: 'security.egress_blocked',
};

type CallResult =
  | { ok: true; output: unknown; reportedCostUnits: number | undefined; status: number }
  | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown> };

/** One executor's hold on one run, from taking it up to letting it go. */
interface Execution {
  /** Who the run executes as: its owning agent. */
  principal: AgentPrincipal;
  request: RunRequest;
  traceId: string;
  /** The door the request came through when not the REST API (`mcp`): its records say so. */
  via: Via | undefined;
  /** The run as this executor took it up (its epoch is this executor's). */
  run: RunRecord;
  /** The hand-off that made this run, for a sub-run: its envelope and budget. */
  delegation: Handoff | undefined;
  /** The actor whose request drives this execution: the proposer of any approval it asks for. */
  actor: string;
  /** The first step's grants, read while the run was claimed; taken by that step. */
  prefetchedGrants?: GrantPrefetch | undefined;
}

interface StepOutcome {
  step: StepResult;
  stop?: { code: ErrorCode; retryAfterSeconds?: number };
  /** What the stop is recorded as besides the step's own record: committed with the run's end. */
  ending?: AuditEventInput[];
  held?: Hold;
  tool?: AdmissibleTool;
  /** The run moved on while the call was admitted: nothing was sent, its reservation released. */
  movedOn?: Pick<RunRecord, 'status' | 'stop'>;
  /** The step ended the run in the commit of its own record: the run's answer. */
  ended?: RunAnswer;
}

/**
 * The run's end after a step, for a step whose record can carry it (see `closingAt`): the
 * answer, when the step ends the run, or undefined when the run goes on or must end otherwise.
 */
type Closing = (step: StepResult, stop: StepOutcome['stop']) => RunAnswer | undefined;

/** What became of an admitted call: its output or failure, what it cost, its record. */
type Dispatched =
  | { ok: true; output: unknown; costUnits: number; auditId: string }
  | {
      ok: false;
      code: ErrorCode;
      message: string;
      details: Record<string, unknown>;
      costUnits: number;
      auditId: string | null;
    };

/** The largest envelope (in UTF-16 code units of its JSON) a run's last record carries with it. */
const MAX_ENVELOPE_WITH_RECORD = 64 * 1024;

/** Thrown inside a transaction to undo it when the run moved on without this executor. */
class RunMovedOn extends Error {}

/**
 * Executes runs: claims the run id, takes each step through admission, dispatches what is
 * admitted with an intent record committed first, and stores the envelope for replays. At every
 * call boundary (but the first after its claim) it re-reads the run, so a control or cascade from
 * any replica stops it there.
 */
export class RunExecutor {
  /** Claims and ends of runs that happen at the same moment share one statement (group commit). */
  private readonly claims: GroupCommit<NewRun, RunRecord | undefined>;
  private readonly ends: GroupCommit<RunEnding, boolean>;

  constructor(private readonly deps: RunExecutorDeps) {
    const { hot, hotDeferred } = deps.database;
    // A claim is made durable by the call's intent record, committed synchronously before dispatch.
    this.claims = new GroupCommit((runs) => retryOnConflict(() => claimRuns(hotDeferred, runs)));
    this.ends = new GroupCommit((endings) => retryOnConflict(() => endRuns(hot, endings)));
  }

  async execute(principal: AgentPrincipal, request: RunRequest, traceId: string, via?: Via): Promise<RunAnswer> {
    if (request.dry_run) return this.dryRun(principal, request, traceId);
    const release = this.track({ tenant_id: principal.tenantId, run_id: request.run_id });
    try {
      return await this.executeTracked(principal, request, traceId, via);
    } finally {
      release();
    }
  }

  /**
   * Marks a run as executed here until the returned function is called: take it before the run
   * is claimed or taken up, and release it once the executor has let go of the run or given up.
   * A busy run of this replica that is not marked was lost, and recovery ends it.
   */
  track(key: { tenant_id: string; run_id: string }): () => void {
    return this.deps.recovery.track(key);
  }

  private async executeTracked(
    principal: AgentPrincipal,
    request: RunRequest,
    traceId: string,
    via: Via | undefined,
  ): Promise<RunAnswer> {
    const requestSha256 = payloadHash(request);
    const start: RunStart = {
      request_sha256: requestSha256,
      request,
      agent_family: principal.family,
      agent_scopes: [...principal.scopes].sort(),
      keep_open: request.keep_open === true,
    };
    let run: RunRecord;
    if (request.parent_run_id !== undefined) {
      // A sub-run exists from its hand-off on; nothing else may claim a parent.
      const existing = await findRun(this.deps.database.control, principal.tenantId, request.run_id);
      // Another principal's run id is a conflict, whatever it is: what its runs are made of is not
      // this caller's to learn.
      if (existing && existing.agent_id !== principal.id)
        return this.refuse(principal, request, traceId, via, 'run.rejected', notOwned(request));
      if (!existing || existing.parent_run_id === null) {
        return this.refuse(
          principal,
          request,
          traceId,
          via,
          'handoff.rejected',
          new CodedError(
            'handoff_rejected',
            `no hand-off from ${request.parent_run_id} created run ${request.run_id}`,
            { reason: 'handoff_missing' },
          ),
        );
      }
      run = existing;
    } else {
      // The first step's grants are read while the run is claimed, instead of after.
      const prefetched = this.deps.ports.grants.prefetch?.(
        grantQueryOf(
          principal,
          this.stepRequest(principal, request, 0, false, undefined).run,
          request.plan[0]!.tool_id,
        ),
      );
      const claim = {
        ...start,
        tenant_id: principal.tenantId,
        run_id: request.run_id,
        agent_id: principal.id,
        pipeline_instance_id: request.pipeline_instance_id,
        session_id: request.session_id,
        user_id: request.user_id,
        trace_id: traceId,
        budget_units: request.budget_units,
        created_at: this.deps.now(),
        executor_id: this.deps.replicaId,
      };
      // A run id taken at the claim can be gone when it is read (the retention sweep deletes
      // finished runs): it is free again then, and claimed once more.
      let existing: RunRecord | undefined;
      for (let attempt = 1; attempt <= 2 && !existing; attempt += 1) {
        const claimed = await this.claims.submit(claim);
        if (claimed)
          return this.runFrom(
            {
              ...(await this.execution(claimed, principal, request, traceId, actorOf(principal), via)),
              prefetchedGrants: prefetched,
            },
            [],
            true,
          );
        existing = await findRun(this.deps.database.control, principal.tenantId, request.run_id);
      }
      if (!existing)
        return this.refuse(
          principal,
          request,
          traceId,
          via,
          'run.rejected',
          new CodedError('run_id_conflict', `run ${request.run_id} changed while being claimed; try again`),
        );
      run = existing;
    }
    const prior = await this.replayOrContinue(principal, request, run, start, traceId, via);
    if ('replay' in prior) return prior.replay;
    return this.runFrom(
      await this.execution(prior.run, principal, request, traceId, actorOf(principal), via),
      completedSteps(prior.run),
    );
  }

  /**
   * Continues a run that a control has just taken up for this executor (`claimIdleRun`): an
   * approved, paused or throttled run. Every step still to run passes every stage again.
   */
  async continueRun(
    run: RunRecord,
    principal: AgentPrincipal,
    traceId: string,
    actor: string,
    via?: Via,
  ): Promise<RunAnswer> {
    if (!run.request) throw new Error(`run ${run.run_id} has no request to continue`);
    return this.runFrom(await this.execution(run, principal, run.request, traceId, actor, via), completedSteps(run));
  }

  /**
   * A run id seen before: another principal's is a conflict; the owner's finished (or waiting)
   * run replays; a throttled run continues after its completed steps; a queued sub-run starts.
   */
  private async replayOrContinue(
    principal: AgentPrincipal,
    request: RunRequest,
    run: RunRecord,
    start: RunStart,
    traceId: string,
    via: Via | undefined,
  ): Promise<{ replay: RunAnswer } | { run: RunRecord }> {
    if (run.agent_id !== principal.id)
      return this.refuse(principal, request, traceId, via, 'run.rejected', notOwned(request));
    if (run.request_sha256 === null) {
      if (run.parent_run_id !== (request.parent_run_id ?? null)) {
        return this.refuse(
          principal,
          request,
          traceId,
          via,
          'run.rejected',
          new CodedError('run_id_conflict', `run ${request.run_id} was handed off from ${run.parent_run_id}`, {
            parent_run_id: run.parent_run_id,
          }),
        );
      }
      if (run.status === 'queued') {
        const started = await startQueuedRun(
          this.deps.database.control,
          run,
          {
            ...start,
            budget_units: request.budget_units,
            pipeline_instance_id: request.pipeline_instance_id,
            session_id: request.session_id,
            user_id: request.user_id,
          },
          this.deps.replicaId,
        );
        if (started) return { run: started };
      }
      // Still waiting for its hand-off's approval: one that lapsed is expired, as a resume would.
      if (run.status === 'awaiting_approval')
        await this.refuseLapsedApproval(principal, run, traceId, handoffApprovalOf);
      return this.refuse(
        principal,
        request,
        traceId,
        via,
        'run.rejected',
        new CodedError('run_not_resumable', `run ${request.run_id} is ${run.status}; it cannot start now`, {
          status: run.status,
          ...(run.stop ? { reason_code: run.stop.code } : {}),
        }),
      );
    }
    if (run.request_sha256 !== start.request_sha256) {
      return this.refuse(
        principal,
        request,
        traceId,
        via,
        'run.rejected',
        new CodedError('run_id_conflict', `run_id ${request.run_id} was used for a different request`, {
          status: run.status,
        }),
      );
    }
    if (run.busy) {
      // Ends the run if its executor was lost (this request's own mark on it does not count);
      // either way, a run let go of meanwhile — by recovery, or by its executor — answers as it
      // now stands, and one still busy is refused below.
      await this.deps.recovery.recoverIfLost(run, 1);
      const now = await findRun(this.deps.database.control, run.tenant_id, run.run_id);
      if (now && !now.busy) return this.replayOrContinue(principal, request, now, start, traceId, via);
    }
    // A finished run, or one still waiting (for an approval, an operator), answers as stored; a
    // throttled one goes on below: its Retry-After may have passed.
    if (
      run.envelope &&
      run.http_status !== null &&
      !run.busy &&
      (isTerminal(run.status) || (run.envelope.status === run.status && run.status !== 'throttled'))
    ) {
      return { replay: { httpStatus: run.http_status, envelope: run.envelope, replayed: true } };
    }
    if (run.status === 'throttled') {
      await this.refuseLapsedApproval(principal, run, traceId, findNextStepApproval);
      const resumed = await resumeThrottledRun(
        this.deps.database.control,
        {
          tenant_id: principal.tenantId,
          run_id: request.run_id,
          agent_id: principal.id,
          request_sha256: start.request_sha256,
        },
        this.deps.replicaId,
      );
      if (resumed) return { run: resumed };
    }
    return this.refuse(
      principal,
      request,
      traceId,
      via,
      'run.rejected',
      new CodedError('run_id_conflict', `run ${request.run_id} is ${run.status}; it cannot be executed again now`, {
        status: run.status,
      }),
    );
  }

  /**
   * A waiting run whose approval lapsed meanwhile — a throttled run's next step's, unused past its
   * time, or a sub-run's hand-off's, undecided — is not taken up again, as a resume would not take
   * it up: the approval is recorded as expired, the run cancelled, and the request refused with
   * `409 run_not_resumable`.
   */
  private async refuseLapsedApproval(
    principal: AgentPrincipal,
    run: RunRecord,
    traceId: string,
    approvalOf: (db: Kysely<DB>, run: RunRecord) => Promise<Approval | undefined>,
  ): Promise<void> {
    const now = this.deps.now();
    const seen = await approvalOf(this.deps.database.control, run);
    if (!seen || approvalStatusAt(seen, now, seen.kind === 'tool_call') !== 'expired') return;
    const refusal = await changeInLockOrder(this.deps.database.control, async (trx) => {
      const locked = await lockRun(trx, run);
      // Taken up, ended or moved on meanwhile: the request is answered as that run stands.
      if (!locked || locked.status !== run.status || locked.busy) return undefined;
      return this.deps.approvals.expireLapsed(trx, await approvalOf(trx, locked), actorOf(principal), now, traceId);
    });
    if (refusal) throw new CodedError(refusal.code, refusal.message, refusal.details);
  }

  /**
   * Refuses a whole request, on record as every denial is (SPEC §8): under the run id asked for
   * and the agent that asked, saying no more than the answer does. The parent_run_id the request
   * named is `parent_run_id`, or `requested_parent_run_id` when the answer names the run's own.
   */
  private async refuse(
    principal: AgentPrincipal,
    request: RunRequest,
    traceId: string,
    via: Via | undefined,
    eventType: string,
    error: CodedError,
  ): Promise<never> {
    const named =
      request.parent_run_id === undefined
        ? {}
        : 'parent_run_id' in error.details
          ? { requested_parent_run_id: request.parent_run_id }
          : { parent_run_id: request.parent_run_id };
    await this.deps.audit.append({
      event_type: eventType,
      actor: actorOf(principal),
      tenant_id: principal.tenantId,
      agent_id: principal.id,
      run_id: request.run_id,
      trace_id: traceId,
      status: 'denied',
      reason_code: error.code,
      details: { ...error.details, message: error.message, ...named, ...(via ? { via } : {}) },
    });
    throw error;
  }

  private async execution(
    run: RunRecord,
    principal: AgentPrincipal,
    request: RunRequest,
    traceId: string,
    actor: string,
    via: Via | undefined,
  ): Promise<Execution> {
    const delegation =
      run.depth > 0 ? await findHandoffOfSubRun(this.deps.database.control, run.tenant_id, run.run_id) : undefined;
    return { principal, request, traceId, via, run, delegation, actor };
  }

  /**
   * Takes the run through its remaining steps. Before each call it re-reads the run, except
   * before the first call of a run it has just claimed: the claim itself is that reading.
   */
  private async runFrom(exec: Execution, completedBefore: StepResult[], justClaimed = false): Promise<RunAnswer> {
    const { request } = exec;
    const steps: StepResult[] = [...completedBefore];
    const warnings: string[] = [];
    // A sub-run paused between its last call's settlement and the kill that call's overshoot
    // caused: taken up again, it is killed for it now, not let go on (or complete) over budget.
    const last = completedBefore[completedBefore.length - 1];
    const leftOver = exec.delegation && last ? await this.overshoot(exec, last) : undefined;
    if (leftOver) return this.killForOvershoot(exec, steps, warnings, leftOver);
    for (let index = completedBefore.length; index < request.plan.length; index += 1) {
      const standing =
        justClaimed && index === completedBefore.length
          ? exec.run
          : await readRunStanding(this.deps.database.control, exec.run);
      if (!standing || standing.status !== 'running' || standing.epoch !== exec.run.epoch) {
        return this.interrupted(exec, steps, warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
      }
      const outcome = await this.runStep(exec, index, warnings, this.closingAt(exec, steps, warnings, index));
      if (outcome.ended) return outcome.ended;
      if (outcome.movedOn) return this.interrupted(exec, steps, warnings, outcome.movedOn.status, outcome.movedOn.stop);
      steps.push(outcome.step);
      if (outcome.held) return this.hold(exec, steps, warnings, outcome.held, outcome.tool!);
      if (outcome.stop) {
        for (let rest = index + 1; rest < request.plan.length; rest += 1) steps.push(stepAt(request, rest, 'skipped'));
        const code = outcome.stop.code;
        const envelope: RunEnvelope = {
          run_id: request.run_id,
          status: statusAfter(code),
          dry_run: false,
          steps,
          warnings,
        };
        if (outcome.stop.retryAfterSeconds !== undefined) envelope.retry_after_seconds = outcome.stop.retryAfterSeconds;
        return this.leave(exec, statusForCode(code), envelope, outcome.ending);
      }
      const overshoot =
        exec.delegation && outcome.step.status === 'completed' ? await this.overshoot(exec, outcome.step) : undefined;
      if (overshoot) return this.killForOvershoot(exec, steps, warnings, overshoot);
    }
    const status: RunStatus = exec.run.keep_open ? 'running' : 'completed';
    return this.leave(exec, 200, { run_id: request.run_id, status, dry_run: false, steps, warnings });
  }

  /**
   * How the step at `index` ends the run when its record can carry the run's end (one commit
   * instead of two): a root run's last step, or a step that stops it in a final status. A sub-run
   * (its end closes a hand-off, under the audit chain's lock) and a run kept open end otherwise.
   * The envelope is the one `runFrom` would store after the step.
   */
  private closingAt(exec: Execution, steps: StepResult[], warnings: string[], index: number): Closing | undefined {
    const { request, run } = exec;
    if (run.depth > 0 || exec.delegation || run.keep_open) return undefined;
    return (step, stop) => {
      const all = [...steps, step];
      if (!stop) {
        if (index !== request.plan.length - 1) return undefined;
        return {
          httpStatus: 200,
          envelope: { run_id: request.run_id, status: 'completed', dry_run: false, steps: all, warnings },
          replayed: false,
        };
      }
      const status = statusAfter(stop.code);
      if (!isTerminal(status)) return undefined;
      for (let rest = index + 1; rest < request.plan.length; rest += 1) all.push(stepAt(request, rest, 'skipped'));
      const envelope: RunEnvelope = { run_id: request.run_id, status, dry_run: false, steps: all, warnings };
      if (stop.retryAfterSeconds !== undefined) envelope.retry_after_seconds = stop.retryAfterSeconds;
      return { httpStatus: statusForCode(stop.code), envelope, replayed: false };
    };
  }

  /**
   * The run's end `closing` gives for a step, as the audit log carries it; the answer kept in
   * `answered`. A large envelope (outputs of megabytes) ends the run the usual way: the record that
   * would carry it holds the audit chain's head while PostgreSQL reads it, and every replica's
   * appends wait meanwhile.
   */
  private endFor(
    exec: Execution,
    closing: Closing | undefined,
    step: StepResult,
    stop: StepOutcome['stop'],
    answered: { answer?: RunAnswer },
  ): RunEnding | undefined {
    const answer = closing?.(step, stop);
    if (!answer || JSON.stringify(answer.envelope).length > MAX_ENVELOPE_WITH_RECORD) return undefined;
    answered.answer = answer;
    const { run } = exec;
    return {
      tenant_id: run.tenant_id,
      run_id: run.run_id,
      epoch: run.epoch,
      status: answer.envelope.status,
      httpStatus: answer.httpStatus,
      envelope: answer.envelope,
    };
  }

  /** Kills a sub-run whose calls passed its handed budget: the rest is skipped, the overshoot recorded with the kill. */
  private killForOvershoot(
    exec: Execution,
    steps: StepResult[],
    warnings: string[],
    overshoot: AuditEventInput,
  ): Promise<RunAnswer> {
    const { request } = exec;
    for (let rest = steps.length; rest < request.plan.length; rest += 1) steps.push(stepAt(request, rest, 'skipped'));
    return this.leave(
      exec,
      statusForCode('budget_exceeded'),
      {
        run_id: request.run_id,
        status: 'killed',
        dry_run: false,
        steps,
        warnings: [...warnings, 'subagent_budget_exceeded'],
      },
      [overshoot],
    );
  }

  private async runStep(
    exec: Execution,
    index: number,
    warnings: string[],
    closing: Closing | undefined,
  ): Promise<StepOutcome> {
    const { request } = exec;
    const planned = request.plan[index]!;
    const started = performance.now();
    const stepRequest = this.stepRequest(exec.principal, request, index, false, exec);
    if (index === 0 && exec.prefetchedGrants) stepRequest.prefetchedGrants = exec.prefetchedGrants;
    delete exec.prefetchedGrants;
    const admission = await admitStep(stepRequest, this.deps.ports);
    this.deps.metrics.admissionDuration.observe((performance.now() - started) / 1000);
    const tool = admission.state.tool;
    const base = this.auditBase(exec, index, tool);

    if (admission.held) {
      this.deps.metrics.decisions.inc({ outcome: 'held', reason: 'awaiting_approval' });
      return {
        step: {
          ...stepHead(request, index, tool),
          status: 'awaiting_approval',
          cost_units: 0,
          duration_ms: elapsed(started),
          audit_id: null,
        },
        held: admission.held,
        tool: tool!,
      };
    }
    if (!admission.ok) return this.denied(exec, admission, base, index, started, closing);

    warnings.push(...admission.state.warnings);
    const admitted = admission.state.tool!;
    const reservation = admission.state.reservation;
    // A sub-run stopped while its call was admitted (its parent ended, a control, a cascade) has
    // had its hand-off closed and its use handed back to the parent: a call sent now would spend
    // beyond the parent's reach. Its reservation was written to the sub-run's counter, which that
    // close locks after the run's row: read after the reservation, and after whatever holds the
    // row, the run shows any close that did not recharge the reservation to the parent.
    if (exec.delegation) {
      const standing = await readRunStandingSettled(this.deps.database.control, exec.run);
      if (!standing || standing.status !== 'running' || standing.epoch !== exec.run.epoch) {
        if (reservation) await this.deps.ports.budgets.release(reservation);
        return {
          step: stepAt(request, index, 'skipped'),
          movedOn: { status: standing?.status ?? 'cancelled', stop: standing?.stop ?? null },
        };
      }
    }
    this.deps.metrics.decisions.inc({ outcome: 'admitted', reason: 'ok' });
    // The step as the envelope shows it, made once: when it ends the run, before its record is
    // appended (the record carries the run's end, whose envelope holds the step).
    let step: StepResult | undefined;
    const stepOf = (result: Dispatched): StepResult =>
      (step ??= result.ok
        ? {
            ...stepHead(request, index, admitted),
            status: 'completed',
            output: result.output,
            cost_units: result.costUnits,
            duration_ms: elapsed(started),
            audit_id: result.auditId,
          }
        : {
            ...stepHead(request, index, admitted),
            status: 'failed',
            error: { code: result.code, message: result.message, details: result.details },
            cost_units: result.costUnits,
            duration_ms: elapsed(started),
            audit_id: result.auditId,
          });
    const answered: { answer?: RunAnswer } = {};
    const end =
      closing &&
      ((result: Dispatched) =>
        this.endFor(exec, closing, stepOf(result), result.ok ? undefined : { code: result.code }, answered));
    const result = await this.dispatch(
      exec,
      admitted,
      planned.input,
      base,
      reservation,
      admission.state.grant?.capability_modifiers ?? {},
      admission.state.approvalId,
      end,
    );
    const done = stepOf(result);
    if (result.runEnded) return { step: done, ended: answered.answer! };
    return result.ok ? { step: done } : { step: done, stop: { code: result.code } };
  }

  private async denied(
    exec: Execution,
    admission: Admission & { ok: false },
    base: AuditEventInput,
    index: number,
    started: number,
    closing: Closing | undefined,
  ): Promise<StepOutcome> {
    const denial = admission.denial!;
    this.deps.metrics.decisions.inc({ outcome: 'denied', reason: denial.code });
    const stage = admission.verdicts[admission.verdicts.length - 1]?.stage;
    // A sub-run's call that its handed budget cannot pay for is an overshoot (SPEC §6).
    const overshoot =
      exec.delegation !== undefined &&
      stage === 'cost' &&
      denial.details?.source === 'request' &&
      exec.run.budget_units === exec.delegation.budget_units;
    const event: AuditEventInput = {
      ...base,
      event_type: SECURITY_DENIALS[denial.code] ?? 'run.step.denied',
      status: 'denied',
      reason_code: denial.code,
      details: { ...base.details, stage, message: denial.message, ...(denial.details ?? {}) },
    };
    const error = errorOf(
      overshoot ? { ...denial, details: { ...denial.details, reason: 'subagent_budget_exceeded' } } : denial,
    );
    const stop = {
      code: denial.code,
      ...(denial.retryAfterSeconds !== undefined ? { retryAfterSeconds: denial.retryAfterSeconds } : {}),
    };
    const eventId = randomUUID();
    const step: StepResult = {
      ...stepHead(exec.request, index, admission.state.tool),
      status: 'denied',
      error,
      cost_units: 0,
      duration_ms: elapsed(started),
      audit_id: eventId,
    };
    const answered: { answer?: RunAnswer } = {};
    const leave = overshoot ? undefined : this.endFor(exec, closing, step, stop, answered);
    const { applied: runEnded } = await this.deps.audit.appendCarrying(event, eventId, leave);
    if (runEnded) return { step, ended: answered.answer! };
    return { step, stop, ...(overshoot ? { ending: [this.overshootEvent(exec, base, denial.details ?? {})] } : {}) };
  }

  /**
   * After a sub-run's call settled: if what it has used passed its handed budget, the overshoot
   * event, to be recorded with the kill it causes.
   */
  private async overshoot(exec: Execution, step: StepResult): Promise<AuditEventInput | undefined> {
    const budget = exec.delegation!.budget_units;
    const used = await readRunUsage(this.deps.database.control, exec.run.tenant_id, exec.run.run_id);
    if (used <= budget) return undefined;
    const base = this.auditBase(exec, step.index, undefined);
    return this.overshootEvent(
      exec,
      { ...base, tool_id: step.tool_id, tool_version: step.version },
      { used_units: used, budget_units: budget, after_step: step.index },
    );
  }

  private overshootEvent(exec: Execution, base: AuditEventInput, details: Record<string, unknown>): AuditEventInput {
    return {
      ...base,
      event_type: 'run.subagent_budget_exceeded',
      status: 'killed',
      reason_code: 'budget_exceeded',
      details: {
        ...base.details,
        reason: 'subagent_budget_exceeded',
        handoff_id: exec.delegation!.id,
        parent_run_id: exec.run.parent_run_id,
        handed_units: exec.delegation!.budget_units,
        ...details,
      },
    };
  }

  /**
   * Stage 8 held a call: the proposal is recorded, bound to the run, the step, the tool version
   * and the input's SHA-256, and the run waits as `awaiting_approval` (202). Nothing was spent.
   */
  private async hold(
    exec: Execution,
    steps: StepResult[],
    warnings: string[],
    held: Hold,
    tool: AdmissibleTool,
  ): Promise<RunAnswer> {
    const { request, run } = exec;
    const index = steps.length - 1;
    const now = this.deps.now();
    const approvalId = `apr_${randomBytes(10).toString('hex')}`;
    try {
      return await changeInLockOrder(this.deps.database.control, async (trx) => {
        await cancelPendingApprovals(trx, [run], index);
        const approval = await insertApproval(trx, {
          id: approvalId,
          tenant_id: run.tenant_id,
          kind: 'tool_call',
          run_id: run.run_id,
          agent_id: run.agent_id,
          step_index: index,
          tool_id: tool.id,
          tool_version: tool.version,
          input: request.plan[index]!.input,
          input_sha256: held.inputSha256,
          handoff_id: null,
          proposed_by: exec.actor,
          created_at: now,
          expires_at: new Date(now.getTime() + this.deps.approvalTtlMs),
        });
        const base = this.auditBase(exec, index, tool);
        const [record] = await writeAuditEvents(trx, [
          {
            occurredAt: now,
            event: {
              ...base,
              event_type: 'approval.requested',
              actor: exec.actor,
              status: 'awaiting_approval',
              input_sha256: held.inputSha256,
              details: {
                ...base.details,
                approval_id: approval.id,
                step_index: index,
                proposed_by: exec.actor,
                expires_at: approval.expires_at.toISOString(),
              },
            },
          },
        ]);
        steps[index] = { ...steps[index]!, audit_id: record!.event_id, approval_id: approval.id };
        for (let rest = index + 1; rest < request.plan.length; rest += 1) steps.push(stepAt(request, rest, 'pending'));
        const envelope: RunEnvelope = {
          run_id: request.run_id,
          status: 'awaiting_approval',
          dry_run: false,
          steps,
          warnings,
        };
        if (
          !(await releaseRun(
            trx,
            { ...run, epoch: run.epoch },
            { status: 'awaiting_approval', httpStatus: 202, envelope },
          ))
        )
          throw new RunMovedOn();
        return { httpStatus: 202, envelope, replayed: false };
      });
    } catch (error) {
      if (!(error instanceof RunMovedOn)) throw error;
      steps.length = index;
      const standing = await readRunStanding(this.deps.database.control, run);
      return this.interrupted(exec, steps, warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
    }
  }

  /**
   * The run moved on between calls — a control or a cascade, from any replica: a stopped run
   * refuses its next step with the reason it was stopped; a paused one keeps it pending.
   */
  private async interrupted(
    exec: Execution,
    steps: StepResult[],
    warnings: string[],
    status: RunStatus,
    stop: RunStop | null,
  ): Promise<RunAnswer> {
    const { request } = exec;
    let httpStatus = 202;
    if (isTerminal(status)) {
      const error = stop ?? {
        code: 'run_not_resumable' as const,
        message: `the run is ${status}`,
        details: { status },
        audit_id: null,
      };
      httpStatus = statusForCode(error.code);
      if (steps.length < request.plan.length) {
        steps.push({
          ...stepAt(request, steps.length, 'denied'),
          error: { code: error.code, message: error.message, details: error.details },
          audit_id: error.audit_id,
        });
      }
      while (steps.length < request.plan.length) steps.push(stepAt(request, steps.length, 'skipped'));
    } else {
      while (steps.length < request.plan.length) steps.push(stepAt(request, steps.length, 'pending'));
    }
    const envelope: RunEnvelope = { run_id: request.run_id, status, dry_run: false, steps, warnings };
    await releaseRun(this.deps.database.control, exec.run, { httpStatus, envelope });
    return { httpStatus, envelope, replayed: false };
  }

  /**
   * Lets go of the run with where it got to. A run that ends here takes its open sub-runs with
   * it and closes its own hand-off; that needs the audit chain's lock before the run's, so it is
   * done again that way when it turns out to be needed. `ending` (an overshoot that kills a
   * sub-run) is recorded in the commit that ends the run, or not at all if the run moved on.
   */
  private async leave(
    exec: Execution,
    httpStatus: number,
    envelope: RunEnvelope,
    ending: AuditEventInput[] = [],
  ): Promise<RunAnswer> {
    const { run } = exec;
    const status = envelope.status;
    if (!isTerminal(status)) {
      if (ending.length > 0)
        throw new Error(`run ${run.run_id}: events recorded with an end, but it does not end (${status})`);
      if (await releaseRun(this.deps.database.control, run, { status, httpStatus, envelope }))
        return { httpStatus, envelope, replayed: false };
    } else {
      const change = { status, httpStatus, envelope };
      const left = await this.leaveTerminal(exec, change, run.depth > 0 || ending.length > 0, ending);
      if (left === 'retry' ? await this.leaveTerminal(exec, change, true, ending) : left)
        return { httpStatus, envelope, replayed: false };
    }
    // Stopped or paused between the last call and now: the run is someone else's to describe.
    const standing = await readRunStanding(this.deps.database.control, run);
    const done = envelope.steps.filter((s) => s.status === 'completed');
    return this.interrupted(exec, done, envelope.warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
  }

  private async leaveTerminal(
    exec: Execution,
    change: { status: TerminalStatus; httpStatus: number; envelope: RunEnvelope },
    locked: boolean,
    ending: AuditEventInput[],
  ): Promise<boolean | 'retry'> {
    const { run } = exec;
    if (!locked) {
      // Most runs have no sub-run and no hand-off: they end without the audit chain, in one
      // statement shared with the runs ending at the same moment.
      return (await this.ends.submit({ tenant_id: run.tenant_id, run_id: run.run_id, epoch: run.epoch, ...change }))
        ? true
        : 'retry';
    }
    const now = this.deps.now();
    return changeInLockOrder(this.deps.database.control, async (trx) => {
      const left = await releaseRun(trx, run, change);
      if (!left) return false;
      await writeAuditEvents(
        trx,
        ending.map((event) => ({ event, occurredAt: now })),
      );
      await followRunEnd(trx, { ...left, status: change.status }, exec.actor, now);
      return true;
    });
  }

  /**
   * Step 12. The intent record is committed before the backend is contacted and the outcome
   * record before the answer returns: if either cannot be written, the run stops with 503.
   */
  private async dispatch(
    exec: Execution,
    tool: AdmissibleTool,
    input: unknown,
    base: AuditEventInput & { tool_call_id: string },
    reservation: Reservation | undefined,
    grantModifiers: Record<string, unknown>,
    approvalId: string | undefined,
    end?: (result: Dispatched) => RunEnding | undefined,
  ): Promise<Dispatched & { runEnded?: boolean }> {
    const { budgets } = this.deps.ports;
    const inputSha256 = payloadHash(input);
    const details = { ...base.details, ...(approvalId ? { approval_id: approvalId } : {}) };
    if (!tool.backend && tool.category !== 'external_call') {
      if (reservation) await budgets.release(reservation);
      const record = await this.deps.audit.append({
        ...base,
        event_type: 'run.step.failed',
        status: 'failed',
        reason_code: 'tool_backend_not_configured',
        input_sha256: inputSha256,
        details,
      });
      return {
        ok: false,
        code: 'tool_backend_not_configured',
        message: `tool ${tool.id}@${tool.version} has no backend configured`,
        details: {},
        costUnits: 0,
        auditId: record.event_id,
      };
    }
    let headers: Record<string, string> = {};
    try {
      if (tool.backend) headers = this.deps.ports.catalog.backendHeaders(tool);
    } catch (error) {
      // A secret the backend needs is not set on this replica: nothing can be sent.
      if (reservation) await budgets.release(reservation);
      const record = await this.deps.audit.append({
        ...base,
        event_type: 'run.step.failed',
        status: 'failed',
        reason_code: 'tool_backend_not_configured',
        input_sha256: inputSha256,
        details,
      });
      return {
        ok: false,
        code: 'tool_backend_not_configured',
        message: (error as Error).message,
        details: {},
        costUnits: 0,
        auditId: record.event_id,
      };
    }
    try {
      if (!this.deps.lease.valid()) {
        // Another replica may already have ended this replica's runs as lost.
        throw new CodedError(
          'gateway_unavailable',
          'this replica could not renew its lease in time; it dispatches nothing until it can',
        );
      }
      await this.deps.audit.append({
        ...base,
        event_type: 'run.step.dispatching',
        status: 'dispatching',
        input_sha256: inputSha256,
        cost_units: tool.cost_units,
        details: withReservation(details, reservation),
      });
    } catch (error) {
      if (reservation) await budgets.release(reservation).catch(() => undefined);
      throw error;
    }
    const backendStarted = performance.now();
    let result = await this.callBackend(exec, tool, input, base.tool_call_id, grantModifiers, headers);
    const unstorable = result.ok ? jsonProblem(result.output, 'output') : undefined;
    if (unstorable) {
      // An answer no record could hold or hash: the backend failed, and its output is withheld.
      result = {
        ok: false,
        code: 'tool_backend_failed',
        message: `the backend answered JSON that cannot be kept: ${unstorable.path} ${unstorable.message}`,
        details: { reason: 'output_not_storable', path: unstorable.path },
      };
    }
    const backendMs = performance.now() - backendStarted;
    this.deps.metrics.backendDuration.observe(
      { tool_id: tool.id, outcome: result.ok ? 'ok' : result.code },
      backendMs / 1000,
    );

    // The backend was contacted: the call costs what it reported, else the contract's price —
    // at most the grant's `max_cost_units` (the most one call may be charged; the cost stage
    // refused a price above it) and MAX_UNITS (what any one amount may be). Settling runs
    // alongside the outcome record: until it lands, the reservation still holds the units, so
    // budgets only err on the strict side meanwhile.
    const reported = result.ok ? result.reportedCostUnits : undefined;
    const cap = Math.min(
      typeof grantModifiers.max_cost_units === 'number' ? grantModifiers.max_cost_units : MAX_UNITS,
      MAX_UNITS,
    );
    const costUnits = reported === undefined ? tool.cost_units : Math.min(reported, cap);
    const settled = reservation ? budgets.settle(reservation, costUnits) : Promise.resolve(undefined);

    let outcome:
      | { ok: true; output: unknown }
      | { ok: false; code: ErrorCode; message: string; details: Record<string, unknown> } = result.ok
      ? { ok: true, output: result.output }
      : { ok: false, code: result.code, message: result.message, details: result.details };
    if (outcome.ok) {
      const validate = this.deps.ports.catalog.validators(tool).output;
      if (!validate(outcome.output)) {
        const errors = (validate.errors ?? [])
          .slice(0, 10)
          .map((e) => ({ path: e.instancePath || '/', message: e.message ?? 'invalid' }));
        outcome = {
          ok: false,
          code: 'tool_output_schema_invalid',
          message: 'the backend output does not match the output schema; it was withheld',
          details: { errors },
        };
      }
    }
    const eventId = randomUUID();
    const dispatched: Dispatched = outcome.ok
      ? { ok: true, output: outcome.output, costUnits, auditId: eventId }
      : { ...outcome, costUnits, auditId: eventId };
    // The call's last record: when it ends the run, the run's end goes in the same commit.
    const outcomeRecord = this.deps.audit.appendCarrying(
      {
        ...base,
        // Egress refused at a redirect hop is the same security event as at the input stage.
        event_type: outcome.ok ? 'run.step.completed' : (SECURITY_DENIALS[outcome.code] ?? 'run.step.failed'),
        status: outcome.ok ? 'completed' : 'failed',
        reason_code: outcome.ok ? null : outcome.code,
        input_sha256: inputSha256,
        output_sha256: result.ok ? payloadHash(result.output) : null,
        duration_ms: backendMs,
        cost_units: costUnits,
        // The reservation it settles: a settlement lost with its replica is made from this record.
        details: outcome.ok
          ? {
              ...withReservation(details, reservation),
              reported_cost_units: reported ?? null,
              ...(reported !== undefined && reported > cap ? { reported_cost_capped: true, charged_at_most: cap } : {}),
            }
          : { ...withReservation(details, reservation), message: outcome.message, ...outcome.details },
      },
      eventId,
      end?.(dispatched),
    );
    const [{ applied: runEnded }, settlement] = await Promise.all([outcomeRecord, settled]);
    if (settlement === 'settled_after_expiry') {
      // Its units had been given back as abandoned meanwhile: the call is charged all the same.
      // (Recorded after the outcome, and after the run's end when that went with the outcome.)
      await this.deps.audit.append({
        ...base,
        event_type: 'budget.reservation_settled_late',
        status: 'settled',
        cost_units: costUnits,
        details: {
          ...details,
          reservation_id: reservation!.id,
          reserved_units: reservation!.units,
          charged_units: costUnits,
        },
      });
    }
    this.deps.metrics.decisions.inc({
      outcome: outcome.ok ? 'completed' : 'failed',
      reason: outcome.ok ? 'ok' : outcome.code,
    });
    return { ...dispatched, runEnded };
  }

  /** The tool's registered backend, or for `external_call` tools the egress executor (SPEC §9). */
  private async callBackend(
    exec: Execution,
    tool: AdmissibleTool,
    input: unknown,
    toolCallId: string,
    grantModifiers: Record<string, unknown>,
    headers: Record<string, string>,
  ): Promise<CallResult> {
    if (tool.category === 'external_call') {
      if (!tool.egress)
        return {
          ok: false,
          code: 'tool_backend_not_configured',
          message: 'the tool has no egress policy',
          details: {},
        };
      const result = await this.deps.ports.egress.execute(input, tool.egress, grantModifiers);
      if (result.ok)
        return { ok: true, output: result.output, reportedCostUnits: undefined, status: result.output.status };
      return {
        ok: false,
        code: result.code,
        message: `egress ${result.code === 'egress_denied' ? 'refused' : 'failed'}: ${result.reason}`,
        details: { reason: result.reason, ...result.details },
      };
    }
    const backend = tool.backend!;
    return this.deps.backend.call(
      {
        url: backend.url,
        method: backend.method,
        timeoutMs: backend.timeout_ms,
        maxResponseBytes: backend.max_response_bytes,
        headers,
      },
      input,
      {
        runId: exec.request.run_id,
        tenantId: exec.principal.tenantId,
        agentId: exec.principal.id,
        toolCallId,
        traceId: exec.traceId,
      },
    );
  }

  /** Steps 1–11 for every step, reserving and dispatching nothing. */
  private async dryRun(principal: AgentPrincipal, request: RunRequest, _traceId: string): Promise<RunAnswer> {
    const within = request.parent_run_id === undefined ? undefined : await this.subRunBounds(principal, request);
    const steps: StepResult[] = [];
    const warnings: string[] = [];
    for (let index = 0; index < request.plan.length; index += 1) {
      const started = performance.now();
      const admission = await admitStep(this.stepRequest(principal, request, index, true, within), this.deps.ports);
      // An outage is no verdict on a step: a stage that cannot judge (a registry copy or kill-switch
      // snapshot unconfirmed) fails the dry run closed, as a stage meeting the database's outage does.
      if (admission.denial?.code === 'gateway_unavailable')
        throw new CodedError('gateway_unavailable', admission.denial.message, admission.denial.details);
      warnings.push(...admission.state.warnings);
      const head = stepHead(request, index, admission.state.tool);
      const common = { duration_ms: elapsed(started), audit_id: null, verdicts: admission.verdicts };
      steps.push(
        admission.ok
          ? { ...head, ...common, status: 'admissible', cost_units: admission.state.tool?.cost_units ?? 0 }
          : admission.held
            ? { ...head, ...common, status: 'awaiting_approval', cost_units: 0 }
            : { ...head, ...common, status: 'denied', error: errorOf(admission.denial!), cost_units: 0 },
      );
    }
    const firstStop = steps.find((s) => s.status === 'denied' || s.status === 'awaiting_approval');
    const envelope: RunEnvelope = {
      run_id: request.run_id,
      status: firstStop?.error ? statusAfter(firstStop.error.code) : firstStop ? 'awaiting_approval' : 'completed',
      dry_run: true,
      steps,
      warnings,
    };
    return { httpStatus: 200, envelope, replayed: false };
  }

  /**
   * What bounds a dry run of a sub-run, as they would bound it executed: the run its hand-off
   * made (refused as execution refuses a run no hand-off gave, or another agent's), the
   * hand-off's envelope, and its budget, which the request's `budget_units` only lowers.
   */
  private async subRunBounds(
    principal: AgentPrincipal,
    request: RunRequest,
  ): Promise<Pick<Execution, 'run' | 'delegation'>> {
    const run = await findRun(this.deps.database.control, principal.tenantId, request.run_id);
    if (run && run.agent_id !== principal.id) throw notOwned(request);
    if (!run || run.parent_run_id === null || run.parent_run_id !== request.parent_run_id) {
      throw new CodedError(
        'handoff_rejected',
        `no hand-off from ${request.parent_run_id} created run ${request.run_id}`,
        { reason: 'handoff_missing' },
      );
    }
    const delegation = await findHandoffOfSubRun(this.deps.database.control, run.tenant_id, run.run_id);
    const budgets = [run.budget_units, request.budget_units].filter(
      (units): units is number => typeof units === 'number',
    );
    return { run: { ...run, budget_units: budgets.length > 0 ? Math.min(...budgets) : null }, delegation };
  }

  private stepRequest(
    principal: AgentPrincipal,
    request: RunRequest,
    index: number,
    dryRun: boolean,
    exec: Pick<Execution, 'run' | 'delegation'> | undefined,
  ): StepRequest {
    const planned = request.plan[index]!;
    const delegation = exec?.delegation;
    return {
      principal,
      run: {
        run_id: request.run_id,
        parent_run_id: request.parent_run_id,
        pipeline_instance_id: request.pipeline_instance_id,
        session_id: request.session_id,
        user_id: request.user_id,
        context: request.context,
        budget_units: exec?.run.budget_units ?? request.budget_units,
        delegation: delegation
          ? { delegable_tool_ids: delegation.delegable_tool_ids, capability_modifiers: delegation.capability_modifiers }
          : undefined,
      },
      step: { index, tool_id: planned.tool_id, version: planned.version, input: planned.input },
      dryRun,
    };
  }

  private auditBase(
    exec: Execution,
    index: number,
    tool: AdmissibleTool | undefined,
  ): AuditEventInput & { tool_call_id: string; details: Record<string, unknown> } {
    const { principal, request, traceId, run } = exec;
    const context = request.context;
    const text = (value: unknown) => (typeof value === 'string' ? value : null);
    return {
      event_type: 'run.step',
      actor: actorOf(principal),
      tenant_id: principal.tenantId,
      agent_id: principal.id,
      run_id: request.run_id,
      tool_call_id: newToolCallId(request.run_id, index, randomUUID()),
      tool_id: tool?.id ?? request.plan[index]!.tool_id,
      tool_version: tool?.version ?? null,
      tool_category: tool?.category ?? null,
      risk_level: tool?.risk_level ?? null,
      trace_id: traceId,
      organization_id: text(context.organization_id),
      assessment_id: text(context.assessment_id),
      // Which execution of the run made the call (what recovery reads back if it is lost), and,
      // for a sub-run, who it acts for: its ancestors, root first, then itself.
      details: {
        run_epoch: run.epoch,
        ...(run.depth > 0 ? { attribution: attributionOf(run) } : {}),
        ...(exec.via ? { via: exec.via } : {}),
      },
    };
  }
}

/** A sub-run's hand-off approval (its only approval before it starts). */
function handoffApprovalOf(db: Kysely<DB>, run: RunRecord): Promise<Approval | undefined> {
  return findLatestApproval(db, run.tenant_id, run.run_id, null);
}

/** Another principal's run id: a conflict, whatever the run is. */
function notOwned(request: RunRequest): CodedError {
  return new CodedError('run_id_conflict', `run_id ${request.run_id} belongs to another principal`);
}

/** The leading completed steps of a run's stored envelope: where a continued run picks up. */
function completedSteps(run: RunRecord): StepResult[] {
  const steps = run.envelope?.steps ?? [];
  const firstOpen = steps.findIndex((s) => s.status !== 'completed');
  return firstOpen === -1 ? steps : steps.slice(0, firstOpen);
}

function stepHead(
  request: RunRequest,
  index: number,
  tool: AdmissibleTool | undefined,
): Pick<StepResult, 'index' | 'tool_id' | 'version'> {
  return { index, tool_id: request.plan[index]!.tool_id, version: tool?.version ?? null };
}

function stepAt(request: RunRequest, index: number, status: 'skipped' | 'pending' | 'denied'): StepResult {
  return { ...stepHead(request, index, undefined), status, cost_units: 0, duration_ms: 0, audit_id: null };
}

function errorOf(denial: Denial) {
  return { code: denial.code, message: denial.message, details: denial.details ?? {} };
}

/** A call's record details naming the budget reservation it holds, if it holds one. */
function withReservation(
  details: Record<string, unknown>,
  reservation: Reservation | undefined,
): Record<string, unknown> {
  return reservation ? { ...details, reservation_id: reservation.id } : details;
}

function elapsed(started: number): number {
  return Math.round((performance.now() - started) * 1000) / 1000;
}
