import { randomBytes, randomUUID } from 'node:crypto';
import { admitStep, type Admission } from '../admission/admission-pipeline.js';
import { grantQueryOf } from '../admission/stages/04-grant.js';
import type { AdmissibleTool, Denial, GrantAssumed, Hold } from '../admission/ports.js';
import type { StepRequest, StepState } from '../admission/step.js';
import { cancelPendingApprovals, insertApproval } from './approval-repository.js';
import { callSha256 } from './approval.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { readRunUsage } from '../budgets/run-allowance.js';
import { releaseOf } from '../budgets/budget-reservation.js';
import { statusForCode } from '../errors/error-codes.js';
import type { ClaimedRunStart, ClaimedRunStartAnswer, NewRun } from './run-claim-repository.js';
import { releaseRun, type RunEnding } from './run-end-repository.js';
import { readRunStanding, readRunStandingSettled } from './run-repository.js';
import { isTerminal, statusAfter, type RunEnvelope, type RunStatus, type StepResult } from './run-types.js';
import { changeInLockOrder } from '../db/lock-order.js';
import {
  MAX_ENVELOPE_WITH_RECORD,
  RunMovedOn,
  SECURITY_DENIALS,
  auditBase,
  auditSpan,
  chargeOfStep,
  elapsed,
  errorOf,
  relianceOf,
  stepAt,
  stepHead,
  type Closing,
  type Dispatched,
  type Execution,
  type RunExecutorDeps,
  type StepOutcome,
  stepRequest,
} from './execution.js';
import type { Dispatcher } from './dispatch.js';
import type { RunEnder } from './run-ender.js';
import { callEnd } from './run-end-rider.js';
import type { RunAnswer } from './run-types.js';
import { ATTRIBUTES, describeActiveSpan, endedWith, inToolSpan, type Span } from '../telemetry/spans.js';

/** Takes a run through its steps: admission, then a hold, a denial or a dispatch, until it stops or ends. */
export class StepLoop {
  constructor(
    private readonly deps: RunExecutorDeps,
    private readonly ender: RunEnder,
    private readonly dispatcher: Dispatcher,
    /** Whether a call's intent record may carry what its admission decided (`RunExecutor.claimsWithIntent`). */
    private readonly withIntent: () => boolean = () => false,
  ) {}

  /**
   * Takes the run through its remaining steps. Before each call it re-reads the run, except
   * before the first call of a run it has just claimed: the claim itself is that reading.
   */
  async runFrom(exec: Execution, completedBefore: StepResult[], justClaimed = false): Promise<RunAnswer> {
    const answer = await this.run(exec, completedBefore, justClaimed);
    if ('unclaimed' in answer) throw new Error('a claimed run answered as unclaimed');
    return answer;
  }

  /**
   * Takes a root run not claimed yet through its steps, its first call admitted before the claim and the claim
   * written with that call's intent record (`claimWith`): docs/design/call-path.md#the-claim-rides-the-intent-record.
   * `unclaimed` when that record was not appended (nothing was sent): with what the claim did instead.
   */
  runClaimingFirst(
    exec: Execution,
    claimWith: ClaimedRunStart,
  ): Promise<RunAnswer | { unclaimed: ClaimedRunStartAnswer }> {
    return this.run(exec, [], true, claimWith);
  }

  private async run(
    exec: Execution,
    completedBefore: StepResult[],
    justClaimed: boolean,
    claimWith?: ClaimedRunStart,
  ): Promise<RunAnswer | { unclaimed: ClaimedRunStartAnswer }> {
    const { request } = exec;
    const steps: StepResult[] = [...completedBefore];
    const warnings: string[] = [];
    // A sub-run paused between its last call's settlement and the kill that call's overshoot
    // caused: taken up again, it is killed for it now, not let go on (or complete) over budget.
    const last = completedBefore[completedBefore.length - 1];
    const leftOver = exec.delegation && last ? await this.overshoot(exec, last) : undefined;
    if (leftOver) return this.killForOvershoot(exec, steps, warnings, leftOver);
    for (let index = completedBefore.length; index < request.plan.length; index += 1) {
      const claimed = justClaimed && index === completedBefore.length;
      const closing = this.closingAt(exec, steps, warnings, index);
      // A later call decided from the copies: its intent record finds the run still standing, or nothing is sent.
      const held = claimed ? undefined : await this.heldStep(exec, index);
      const warned = warnings.length;
      let outcome = held && (await this.runStep(exec, index, warnings, closing, held));
      if (!outcome || outcome.unclaimed) {
        // Not sent: the call is decided again, and its admission's warnings given again.
        warnings.length = warned;
        const standing = claimed ? exec.run : await readRunStanding(this.deps.database.control, exec.run);
        if (!standing || standing.status !== 'running' || standing.epoch !== exec.run.epoch) {
          return this.ender.interrupted(exec, steps, warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
        }
        outcome = await this.runStep(exec, index, warnings, closing, index === 0 ? claimWith : undefined);
      }
      if (outcome.unclaimed) return { unclaimed: outcome.unclaimed };
      if (outcome.ended) return outcome.ended;
      if (outcome.movedOn)
        return this.ender.interrupted(exec, steps, warnings, outcome.movedOn.status, outcome.movedOn.stop);
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
        return this.ender.end(exec, statusForCode(code), envelope, outcome.ending);
      }
      const overshoot =
        exec.delegation && outcome.step.status === 'completed' ? await this.overshoot(exec, outcome.step) : undefined;
      if (overshoot) return this.killForOvershoot(exec, steps, warnings, overshoot);
    }
    const status: RunStatus = exec.run.keep_open ? 'running' : 'completed';
    return this.ender.end(exec, 200, { run_id: request.run_id, status, dry_run: false, steps, warnings });
  }

  /**
   * The call at `index` of a root run this executor holds, when this replica's copies decide it (its grant, its price, a
   * plain admission by the budget levels it last saw): what its intent record is to write, its admission's decisions
   * set on `exec`. Undefined otherwise, and the call is decided the usual way.
   * docs/design/call-path.md#a-later-call-rides-its-intent-record
   */
  private async heldStep(exec: Execution, index: number): Promise<ClaimedRunStart | undefined> {
    const { principal, request, run } = exec;
    if (run.depth > 0 || exec.delegation || !this.deps.charges || !this.withIntent()) return undefined;
    const asked = stepRequest(principal, request, index, false, exec);
    const assumed = this.deps.ports.grants.assume?.(grantQueryOf(principal, asked.run, asked.step.tool_id));
    if (!assumed) return undefined;
    const charge = await chargeOfStep(this.deps.ports, principal, request, index, assumed, exec);
    if (!charge) return undefined;
    const decided = this.deps.charges.prepare([charge])?.decided[0];
    if (!decided?.ok) return undefined;
    exec.reliedOn = assumed;
    exec.reserved = decided.reservation;
    return {
      held: {
        tenant_id: run.tenant_id,
        run_id: run.run_id,
        epoch: run.epoch,
        reliance: relianceOf(run.tenant_id, run.run_id, assumed),
        charge: { ...charge, reservationId: decided.reservation.id },
      },
    };
  }

  /**
   * How the step at `index` ends a root run when its record can carry the end (one commit instead of two), with the
   * envelope `runFrom` would store: docs/design/audit-chain.md#a-calls-last-record-carries-its-settlement-and-its-runs-end.
   */
  closingAt(exec: Execution, steps: StepResult[], warnings: string[], index: number): Closing | undefined {
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
      // A throttled run is let go of with its envelope, as an ended one is: its record carries that too.
      if (!isTerminal(status) && status !== 'throttled') return undefined;
      for (let rest = index + 1; rest < request.plan.length; rest += 1) all.push(stepAt(request, rest, 'skipped'));
      const envelope: RunEnvelope = { run_id: request.run_id, status, dry_run: false, steps: all, warnings };
      if (stop.retryAfterSeconds !== undefined) envelope.retry_after_seconds = stop.retryAfterSeconds;
      return { httpStatus: statusForCode(stop.code), envelope, replayed: false };
    };
  }

  /**
   * The run's end `closing` gives for a step, as the audit log carries it; the answer kept in `answered`. A large
   * envelope ends the run the usual way: PostgreSQL would read it while holding the chain head every append waits for.
   */
  endFor(
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
  killForOvershoot(
    exec: Execution,
    steps: StepResult[],
    warnings: string[],
    overshoot: AuditEventInput,
  ): Promise<RunAnswer> {
    const { request } = exec;
    for (let rest = steps.length; rest < request.plan.length; rest += 1) steps.push(stepAt(request, rest, 'skipped'));
    return this.ender.end(
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

  /** One tool call, traced as an `execute_tool {tool}` span (SPEC §15). */
  runStep(
    exec: Execution,
    index: number,
    warnings: string[],
    closing: Closing | undefined,
    claimWith?: ClaimedRunStart,
  ): Promise<StepOutcome> {
    return inToolSpan(toolCallOf(exec, index), async (span) => {
      const outcome = await this.takeStep(exec, index, warnings, closing, claimWith);
      describeStep(span, outcome.ended?.envelope.steps.find((s) => s.index === index) ?? outcome.step);
      return outcome;
    });
  }

  private async takeStep(
    exec: Execution,
    index: number,
    warnings: string[],
    closing: Closing | undefined,
    claimWith?: ClaimedRunStart,
  ): Promise<StepOutcome> {
    const { request } = exec;
    const planned = request.plan[index]!;
    const started = performance.now();
    const asked = stepRequest(exec.principal, request, index, false, exec);
    if (claimWith) asked.unclaimed = true;
    if (index === 0 && exec.prefetchedGrants) asked.prefetchedGrants = exec.prefetchedGrants;
    // Decided for this very step: a first call's before its claim, a held run's call from the copies.
    if (exec.reliedOn) asked.reliedOn = exec.reliedOn;
    if (exec.reserved) asked.reserved = exec.reserved;
    if (index === 0 && exec.budgetRefusal) asked.budgetRefusal = exec.budgetRefusal;
    delete exec.prefetchedGrants;
    delete exec.reliedOn;
    delete exec.reserved;
    delete exec.budgetRefusal;
    const admission = await admitStep(asked, this.deps.ports);
    if (claimWith && !admission.ok) {
      // Refused before its run's claim: its record creates the run ended, else the call is decided again on a claim.
      const refused =
        admission.held || !claimWith.claim
          ? undefined
          : await this.refusedStartingRun(exec, admission, claimWith.claim, started);
      if (refused) return { step: stepAt(request, index, 'skipped'), ended: refused };
      return this.unclaimed(exec, index, admission.state);
    }
    this.deps.metrics.admissionDuration.observe((performance.now() - started) / 1000);
    const tool = admission.state.tool;
    const base = auditBase(exec, index, tool);
    describeActiveSpan(callAttributes(base));

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
    if (!claimWith) this.deps.metrics.decisions.inc({ outcome: 'admitted', reason: 'ok' });
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
    const result = await this.dispatcher.dispatch(
      exec,
      admitted,
      planned.input,
      base,
      reservation,
      admission.state.grant?.capability_modifiers ?? {},
      admission.state.approvalId,
      end,
      claimWith,
    );
    if ('unclaimed' in result) return this.unclaimed(exec, index, admission.state, result.unclaimed);
    if (claimWith) this.deps.metrics.decisions.inc({ outcome: 'admitted', reason: 'ok' });
    const done = stepOf(result);
    if (result.runEnded) return { step: done, ended: answered.answer! };
    return result.ok ? { step: done } : { step: done, stop: { code: result.code } };
  }

  /** A first step not taken before its run's claim: the rate token it took goes back, and nothing else was written. */
  private unclaimed(
    exec: Execution,
    index: number,
    state: StepState,
    answer: ClaimedRunStartAnswer = { claimed: false, relied: false },
  ): StepOutcome {
    if (state.rateTaken) this.deps.ports.rateLimiter.giveBack?.(state.rateTaken);
    return { step: stepAt(exec.request, index, 'skipped'), unclaimed: answer };
  }

  async denied(
    exec: Execution,
    admission: Extract<Admission, { denial: Denial }>,
    base: AuditEventInput,
    index: number,
    started: number,
    closing: Closing | undefined,
  ): Promise<StepOutcome> {
    const { event, eventId, step, stop, overshoot } = this.denial(exec, admission, base, index, started);
    const denial = admission.denial;
    this.deps.metrics.decisions.inc({ outcome: 'denied', reason: denial.code });
    const answered: { answer?: RunAnswer } = {};
    const leave = overshoot ? undefined : this.endFor(exec, closing, step, stop, answered);
    // Its record gives back what the call had reserved, and ends the run when it is the run's last word.
    const { answer } = await auditSpan(event, () =>
      this.deps.audit.appendCarrying(event, eventId, callEnd(leave, admission.unspent.map(releaseOf))),
    );
    const releasedApart = admission.unspent.filter((_, i) => answer?.closed[i] === undefined);
    for (const reservation of releasedApart) await this.deps.ports.budgets.release(reservation);
    if (answer?.ended) return { step, ended: answered.answer! };
    return { step, stop, ...(overshoot ? { ending: [this.overshootEvent(exec, base, denial.details ?? {})] } : {}) };
  }

  /** A refused call's record, its step in the envelope, and how it stops the run. */
  private denial(
    exec: Execution,
    admission: Extract<Admission, { denial: Denial }>,
    base: AuditEventInput,
    index: number,
    started: number,
  ): {
    event: AuditEventInput;
    eventId: string;
    step: StepResult;
    stop: NonNullable<StepOutcome['stop']>;
    overshoot: boolean;
  } {
    const denial = admission.denial;
    const stage = admission.verdicts[admission.verdicts.length - 1]?.stage;
    // A sub-run's call that its handed budget cannot pay for is an overshoot.
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
    return { event, eventId, step, stop, overshoot };
  }

  /**
   * The first call of a root run not claimed yet, refused from this replica's copies: its record creates the run
   * already ended, in one statement, if the run id is new and what the refusal rests on still stands (see
   * `EndedRunStart`). `decided` is what the copies said: no grant at all for the call, or its grant and its budget's
   * refusal. Undefined otherwise: nothing was written, and the run is claimed as usual.
   * docs/design/call-path.md#a-first-call-refused-before-its-run-is-claimed
   */
  refuseBeforeClaim(
    exec: Execution,
    claim: NewRun,
    decided:
      { presumedMissing: true } | { reliedOn: GrantAssumed; budgetRefusal: NonNullable<StepRequest['budgetRefusal']> },
  ): Promise<RunAnswer | undefined> {
    return inToolSpan(toolCallOf(exec, 0), async (span) => {
      const answer = await this.refuseFromCopies(exec, claim, decided);
      describeStep(span, answer?.envelope.steps[0] ?? stepAt(exec.request, 0, 'skipped'));
      return answer;
    });
  }

  private async refuseFromCopies(
    exec: Execution,
    claim: NewRun,
    decided:
      { presumedMissing: true } | { reliedOn: GrantAssumed; budgetRefusal: NonNullable<StepRequest['budgetRefusal']> },
  ): Promise<RunAnswer | undefined> {
    const started = performance.now();
    const asked = stepRequest(exec.principal, exec.request, 0, false, exec);
    asked.unclaimed = true;
    if ('presumedMissing' in decided) asked.presumedMissing = true;
    else {
      asked.reliedOn = decided.reliedOn;
      asked.budgetRefusal = decided.budgetRefusal;
    }
    const admission = await admitStep(asked, this.deps.ports);
    if (admission.ok || admission.held) return undefined;
    return this.refusedStartingRun(exec, admission, claim, started);
  }

  /**
   * An unclaimed run's first call refused: its record creates the run already ended, guarded by what the refusal was
   * decided on (no grant at all, or the grant relied on; the bucket level or budget levels it was refused on).
   * Undefined when that record was not appended: nothing was written.
   */
  private async refusedStartingRun(
    exec: Execution,
    admission: Extract<Admission, { denial: Denial }>,
    claim: NewRun,
    started: number,
  ): Promise<RunAnswer | undefined> {
    const base = auditBase(exec, 0, admission.state.tool);
    describeActiveSpan(callAttributes(base));
    const { event, eventId, step, stop } = this.denial(exec, admission, base, 0, started);
    const answered: { answer?: RunAnswer } = {};
    const leave = this.endFor(exec, this.closingAt(exec, [], [], 0), step, stop, answered);
    if (!leave) return undefined;
    const stage = admission.verdicts[admission.verdicts.length - 1]?.stage;
    const { record } = await auditSpan(event, () =>
      this.deps.audit.appendIf(event, eventId, {
        run: claim,
        end: leave,
        ...(claim.reliance
          ? { reliance: claim.reliance }
          : { grantAbsent: { agent_id: exec.principal.id, tool_id: base.tool_id! } }),
        bucket: admission.state.rateRefusedAt,
        budgetRefused: stage === 'cost' && claim.reliance ? claim.charge : undefined,
      }),
    );
    if (!record) return undefined;
    if (admission.state.rateRefusedAt) this.deps.ports.rateLimiter.refusalStood?.(admission.state.rateRefusedAt);
    this.deps.metrics.admissionDuration.observe((performance.now() - started) / 1000);
    this.deps.metrics.decisions.inc({ outcome: 'denied', reason: admission.denial.code });
    return answered.answer;
  }

  /**
   * After a sub-run's call settled: if what it has used passed its handed budget, the overshoot
   * event, to be recorded with the kill it causes.
   */
  async overshoot(exec: Execution, step: StepResult): Promise<AuditEventInput | undefined> {
    const budget = exec.delegation!.budget_units;
    const used = await readRunUsage(this.deps.database.control, exec.run.tenant_id, exec.run.run_id);
    if (used <= budget) return undefined;
    const base = auditBase(exec, step.index, undefined);
    return this.overshootEvent(
      exec,
      { ...base, tool_id: step.tool_id, tool_version: step.version },
      { used_units: used, budget_units: budget, after_step: step.index },
    );
  }

  overshootEvent(exec: Execution, base: AuditEventInput, details: Record<string, unknown>): AuditEventInput {
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
  async hold(
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
          call_sha256: callSha256({
            toolId: tool.id,
            toolVersion: tool.version,
            inputSha256: held.inputSha256,
            context: request.context,
          }),
          handoff_id: null,
          proposed_by: exec.actor,
          created_at: now,
          expires_at: new Date(now.getTime() + this.deps.approvalTtlMs),
        });
        const base = auditBase(exec, index, tool);
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
      return this.ender.interrupted(exec, steps, warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
    }
  }
}

/** Who and what a tool call span names: never its input or output. */
function toolCallOf(exec: Execution, index: number) {
  return {
    toolId: exec.request.plan[index]!.tool_id,
    tenantId: exec.principal.tenantId,
    agentId: exec.principal.id,
    runId: exec.request.run_id,
    step: index,
    via: exec.via,
  };
}

/** The attributes a call's first record names, once admission has resolved its tool. */
export function callAttributes(base: AuditEventInput & { tool_call_id: string }): Record<string, string> {
  return {
    [ATTRIBUTES.toolCallId]: base.tool_call_id,
    ...(base.tool_version ? { [ATTRIBUTES.toolVersion]: base.tool_version } : {}),
  };
}

/** What became of a call: admitted (then completed or failed), denied, held, or skipped (decided again, or not at all). */
function describeStep(span: Span, step: StepResult): void {
  const decision =
    step.status === 'completed' || step.status === 'failed'
      ? 'admitted'
      : step.status === 'awaiting_approval'
        ? 'held'
        : step.status === 'denied'
          ? 'denied'
          : 'skipped';
  span.setAttributes({ [ATTRIBUTES.decision]: decision, [ATTRIBUTES.stepStatus]: step.status });
  if (step.error) endedWith(span, step.error.code);
}
