import { randomUUID } from 'node:crypto';
import { admitStep, type Admission } from '../admission/admission-pipeline.js';
import type { Denial, GrantAssumed } from '../admission/ports.js';
import type { StepRequest } from '../admission/step.js';
import type { AuditEventInput } from '../audit/audit-event.js';
import { releaseOf } from '../budgets/budget-reservation.js';
import type { NewRun } from './run-claim-repository.js';
import type { RunAnswer, StepResult } from './run-types.js';
import {
  SECURITY_DENIALS,
  auditBase,
  auditSpan,
  elapsed,
  errorOf,
  stepAt,
  stepHead,
  type Closing,
  type Execution,
  type RunExecutorDeps,
  type StepOutcome,
  stepRequest,
} from './execution.js';
import { callEnd } from './run-end-rider.js';
import { callAttributes, describeStep, toolCallOf } from './call-span.js';
import { closingAt, endFor } from './step-closing.js';
import { overshootEvent } from './sub-run-overshoot.js';
import { describeActiveSpan, inToolSpan } from '../telemetry/spans.js';

/** Refused calls: their records, their steps, and a first call refused before its run is claimed. */
export class StepRefusals {
  constructor(private readonly deps: RunExecutorDeps) {}

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
    const leave = overshoot ? undefined : endFor(exec, closing, step, stop, answered);
    // Its record gives back what the call had reserved, and ends the run when it is the run's last word.
    const { answer } = await auditSpan(event, () =>
      this.deps.audit.appendCarrying(event, eventId, callEnd(leave, admission.unspent.map(releaseOf))),
    );
    const releasedApart = admission.unspent.filter((_, i) => answer?.closed[i] === undefined);
    for (const reservation of releasedApart) await this.deps.ports.budgets.release(reservation);
    if (answer?.ended) return { step, ended: answered.answer! };
    return { step, stop, ...(overshoot ? { ending: [overshootEvent(exec, base, denial.details ?? {})] } : {}) };
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
  async refusedStartingRun(
    exec: Execution,
    admission: Extract<Admission, { denial: Denial }>,
    claim: NewRun,
    started: number,
  ): Promise<RunAnswer | undefined> {
    const base = auditBase(exec, 0, admission.state.tool);
    describeActiveSpan(callAttributes(base));
    const { event, eventId, step, stop } = this.denial(exec, admission, base, 0, started);
    const answered: { answer?: RunAnswer } = {};
    const leave = endFor(exec, closingAt(exec, [], [], 0), step, stop, answered);
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
}
