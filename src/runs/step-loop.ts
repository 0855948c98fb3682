import { admitStep } from '../admission/admission-pipeline.js';
import { grantQueryOf } from '../admission/stages/04-grant.js';
import type { StepState } from '../admission/step.js';
import { statusForCode } from '../errors/error-codes.js';
import type { ClaimedRunStart, ClaimedRunStartAnswer } from './run-claim-repository.js';
import { readRunStanding, readRunStandingSettled } from './run-repository.js';
import { statusAfter, type RunEnvelope, type RunStatus, type StepResult } from './run-types.js';
import {
  auditBase,
  chargeOfStep,
  elapsed,
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
import type { RunAnswer } from './run-types.js';
import { callAttributes, describeStep, toolCallOf } from './call-span.js';
import { closingAt, endFor } from './step-closing.js';
import { holdForApproval } from './step-hold.js';
import type { StepRefusals } from './step-refusals.js';
import { killForOvershoot, overshootAfter } from './sub-run-overshoot.js';
import { describeActiveSpan, inToolSpan } from '../telemetry/spans.js';

/** Takes a run through its steps: admission, then a hold, a denial or a dispatch, until it stops or ends. */
export class StepLoop {
  constructor(
    private readonly deps: RunExecutorDeps,
    private readonly ender: RunEnder,
    private readonly dispatcher: Dispatcher,
    private readonly refusals: StepRefusals,
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
    const leftOver = exec.delegation && last ? await overshootAfter(this.deps, exec, last) : undefined;
    if (leftOver) return killForOvershoot(this.ender, exec, steps, warnings, leftOver);
    for (let index = completedBefore.length; index < request.plan.length; index += 1) {
      const claimed = justClaimed && index === completedBefore.length;
      const closing = closingAt(exec, steps, warnings, index);
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
      if (outcome.held)
        return holdForApproval(this.deps, this.ender, exec, steps, warnings, outcome.held, outcome.tool!);
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
        exec.delegation && outcome.step.status === 'completed'
          ? await overshootAfter(this.deps, exec, outcome.step)
          : undefined;
      if (overshoot) return killForOvershoot(this.ender, exec, steps, warnings, overshoot);
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
          : await this.refusals.refusedStartingRun(exec, admission, claimWith.claim, started);
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
    if (!admission.ok) return this.refusals.denied(exec, admission, base, index, started, closing);

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
        endFor(exec, closing, stepOf(result), result.ok ? undefined : { code: result.code }, answered));
    const result = await this.dispatcher.dispatch(
      exec,
      admitted,
      asked.step.canonicalInput,
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
}
