import type { Kysely } from 'kysely';
import { grantQueryOf } from '../admission/stages/04-grant.js';
import type { BudgetReservation, ReserveRequest } from '../budgets/budget-reservation.js';
import type { AgentPrincipal } from '../admission/step.js';
import { approvalStatusAt, type Approval } from './approval.js';
import { findLatestApproval, findNextStepApproval } from './approval-repository.js';
import { CanonicalPayload } from '../audit/audit-hash.js';
import { actorOf } from '../auth/principal.js';
import { GroupCommit, retryOnConflict } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import { findHandoffOfSubRun } from './handoff-repository.js';
import { CodedError } from '../errors/coded-error.js';
import {
  claimRuns,
  unclaimedRecordOf,
  type ClaimedRun,
  type ClaimedRunStart,
  type NewRun,
} from './run-claim-repository.js';
import { findRun, lockRun, type RunRecord, type RunStart } from './run-repository.js';
import { resumeThrottledRun, startQueuedRun } from './run-take-up-repository.js';
import { isTerminal, type AnswerSerializer, type RunRequest, type StepResult, type Via } from './run-types.js';
import { changeInLockOrder } from '../db/lock-order.js';
import { chargeOfStep, relianceOf, stepRequest, type Execution, type RunExecutorDeps } from './execution.js';
import { Dispatcher } from './dispatch.js';
import { RunEnder } from './run-ender.js';
import { StepLoop } from './step-loop.js';
import { StepRefusals } from './step-refusals.js';
import { dryRun } from './dry-run.js';
import { notOwned, refuseRequest } from './request-refusal.js';
import type { RunAnswer } from './run-types.js';

/**
 * Executes runs: claims the run id, admits each step, dispatches after an intent record commits, stores the envelope
 * for replays. It re-reads the run at every call boundary, so a control or cascade from any replica stops it there.
 */
export class RunExecutor {
  /** Claims of runs that happen at the same moment share one statement (group commit). */
  private readonly claims: GroupCommit<NewRun, ClaimedRun | undefined>;
  private readonly loop: StepLoop;
  private readonly refusals: StepRefusals;

  constructor(private readonly deps: RunExecutorDeps) {
    // A claim is made durable by the call's intent record, committed synchronously before dispatch.
    this.claims = new GroupCommit((runs) => retryOnConflict(() => this.claim(runs)));
    this.refusals = new StepRefusals(deps);
    this.loop = new StepLoop(deps, new RunEnder(deps), new Dispatcher(deps), this.refusals, () =>
      this.claimsWithIntent(),
    );
  }

  /** `answerJson`: the door's serialiser of its answers, for a run's end to be written once (`AnswerSerializer`). */
  async execute(
    principal: AgentPrincipal,
    request: RunRequest,
    traceId: string,
    via?: Via,
    answerJson?: AnswerSerializer,
  ): Promise<RunAnswer> {
    if (request.dry_run) return dryRun(this.deps, principal, request);
    const release = this.track({ tenant_id: principal.tenantId, run_id: request.run_id });
    try {
      return await this.executeTracked(principal, request, traceId, via, answerJson);
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
    answerJson: AnswerSerializer | undefined,
  ): Promise<RunAnswer> {
    // Serialised and hashed once: the hash replays compare, the JSON the run's row stores.
    const canonical = new CanonicalPayload(request);
    const start: RunStart = {
      request_sha256: canonical.sha256,
      request,
      requestJson: canonical.json,
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
        return refuseRequest(this.deps, principal, request, traceId, via, 'run.rejected', notOwned(request));
      if (!existing || existing.parent_run_id === null) {
        return refuseRequest(
          this.deps,
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
      const firstGrants = grantQueryOf(
        principal,
        stepRequest(principal, request, 0, false, undefined).run,
        request.plan[0]!.tool_id,
      );
      // The first call's grant, decided from this replica's copy, is recorded with the claim; failing
      // that, the first step's grants are read while the run is claimed, instead of after.
      const assumed = this.deps.ports.grants.assume?.(firstGrants);
      const presumedMissing = !assumed && this.deps.ports.grants.presumeMissing?.(firstGrants) === true;
      let prefetched = assumed || presumedMissing ? undefined : this.deps.ports.grants.prefetch?.(firstGrants);
      const charge =
        assumed && this.deps.charges
          ? await chargeOfStep(this.deps.ports, principal, request, 0, assumed, undefined)
          : undefined;
      const claim: NewRun = {
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
        charge,
        reliance: assumed && relianceOf(principal.tenantId, request.run_id, assumed),
      };
      // Decided from this replica's copies, the first call is admitted or refused before its run is claimed.
      const decided =
        assumed && charge && this.claimsWithIntent() ? this.deps.charges?.prepare([charge])?.decided[0] : undefined;
      const first = decided?.ok ? this.claimStart(claim, charge!, decided.reservation) : undefined;
      let taken = false;
      // The run's execution before any claim, for the first call decided from the copies or refused before it.
      const unclaimedExecution = () =>
        this.execution(unclaimedRecordOf(claim), principal, request, traceId, actorOf(principal), via, answerJson);
      if (first) {
        const exec = await unclaimedExecution();
        const answer = await this.loop.runClaimingFirst(
          { ...exec, reliedOn: assumed, reserved: first.reservation },
          first.start,
        );
        if (!('unclaimed' in answer)) return answer;
        const { unclaimed } = answer;
        // Claimed without its call's record (the grant or the budget moved): the call is decided on the claimed run.
        if (unclaimed.claimed)
          return this.loop.runFrom(
            {
              ...exec,
              reliedOn: unclaimed.relied ? assumed : undefined,
              reserved: unclaimed.reservation,
              budgetRefusal: unclaimed.refusal && { units: charge!.units, details: unclaimed.refusal },
            },
            [],
            true,
          );
        // Its id was taken (a replay, another principal's run): the usual way below says what it is.
        taken = unclaimed.taken === true;
      }
      if (presumedMissing || (decided && !decided.ok)) {
        const refused = await this.refusals.refuseBeforeClaim(
          await unclaimedExecution(),
          claim,
          decided && !decided.ok
            ? { reliedOn: assumed!, budgetRefusal: { units: charge!.units, details: decided.details } }
            : { presumedMissing: true },
        );
        if (refused) return refused;
        if (presumedMissing) prefetched = this.deps.ports.grants.prefetch?.(firstGrants);
      }
      // A run id taken at the claim can be gone when it is read (the retention sweep deletes
      // finished runs): it is free again then, and claimed once more.
      let existing = taken ? await findRun(this.deps.database.control, principal.tenantId, request.run_id) : undefined;
      for (let attempt = 1; attempt <= 2 && !existing; attempt += 1) {
        const claimed = await this.claims.submit(claim);
        if (claimed)
          return this.loop.runFrom(
            {
              ...(await this.execution(claimed, principal, request, traceId, actorOf(principal), via, answerJson)),
              prefetchedGrants: prefetched,
              reliedOn: claimed.relied ? assumed : undefined,
              reserved: claimed.reservation,
              budgetRefusal: claimed.refusal && charge && { units: charge.units, details: claimed.refusal },
            },
            [],
            true,
          );
        existing = await findRun(this.deps.database.control, principal.tenantId, request.run_id);
      }
      if (!existing)
        return refuseRequest(
          this.deps,
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
    return this.loop.runFrom(
      await this.execution(prior.run, principal, request, traceId, actorOf(principal), via, answerJson),
      completedSteps(prior.run),
    );
  }

  /**
   * Whether a new run is to be claimed with its first call's intent record. Not while this replica's lease may have
   * lapsed (the run is claimed first, and its recovery lets it go). Nor, while others append to the chain too, when
   * this replica's appends queue: a claim's writes would hold the chain head they all wait for, so claims batch apart
   * instead, beside it (docs/design/call-path.md#the-claim-rides-the-intent-record).
   */
  private claimsWithIntent(): boolean {
    const { lease, audit } = this.deps;
    return lease.valid() && !(audit.shared() && audit.busy());
  }

  /**
   * The claim a first call admitted before its run is claimed writes with its intent record, when this replica's copies
   * say the call fits its budgets; with the reservation that record is to cite.
   */
  private claimStart(
    claim: NewRun,
    charge: ReserveRequest,
    reservation: BudgetReservation,
  ): { start: ClaimedRunStart; reservation: BudgetReservation } | undefined {
    if (!claim.reliance) return undefined;
    return {
      start: { claim: { ...claim, reliance: claim.reliance, charge: { ...charge, reservationId: reservation.id } } },
      reservation,
    };
  }

  /** Claims a batch of runs, with the reservations of the first calls decided before it where the budgets allow. */
  private claim(runs: NewRun[]): Promise<Array<ClaimedRun | undefined>> {
    const keys = new Set<string>();
    const charged = runs.filter((run) => {
      const key = `${run.tenant_id}\u0000${run.run_id}`;
      if (!run.charge || !run.reliance || keys.has(key)) return false;
      keys.add(key);
      return true;
    });
    const prepared = charged.length > 0 ? this.deps.charges?.prepare(charged.map((run) => run.charge!)) : undefined;
    return claimRuns(this.deps.database.hotDeferred, runs, prepared && { runs: charged, prepared });
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
    return this.loop.runFrom(
      await this.execution(run, principal, run.request, traceId, actor, via),
      completedSteps(run),
    );
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
      return refuseRequest(this.deps, principal, request, traceId, via, 'run.rejected', notOwned(request));
    if (run.request_sha256 === null) {
      if (run.parent_run_id !== (request.parent_run_id ?? null)) {
        return refuseRequest(
          this.deps,
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
      return refuseRequest(
        this.deps,
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
      return refuseRequest(
        this.deps,
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
    return refuseRequest(
      this.deps,
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
   * A waiting run whose approval lapsed meanwhile (a throttled run's next step's, a sub-run's hand-off's) is not
   * taken up again, as a resume would not: the approval expires, the run is cancelled, the request is
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

  private async execution(
    run: RunRecord,
    principal: AgentPrincipal,
    request: RunRequest,
    traceId: string,
    actor: string,
    via: Via | undefined,
    answerJson?: AnswerSerializer,
  ): Promise<Execution> {
    const delegation =
      run.depth > 0 ? await findHandoffOfSubRun(this.deps.database.control, run.tenant_id, run.run_id) : undefined;
    return { principal, request, traceId, via, run, delegation, actor, answerJson };
  }
}

/** A sub-run's hand-off approval (its only approval before it starts). */
function handoffApprovalOf(db: Kysely<DB>, run: RunRecord): Promise<Approval | undefined> {
  return findLatestApproval(db, run.tenant_id, run.run_id, null);
}

/** The leading completed steps of a run's stored envelope: where a continued run picks up. */
function completedSteps(run: RunRecord): StepResult[] {
  const steps = run.envelope?.steps ?? [];
  const firstOpen = steps.findIndex((s) => s.status !== 'completed');
  return firstOpen === -1 ? steps : steps.slice(0, firstOpen);
}
