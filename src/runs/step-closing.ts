import { isTerminal, statusAfter, type RunAnswer, type RunEnvelope, type StepResult } from './run-types.js';
import type { RunEnding } from './run-end-repository.js';
import { statusForCode } from '../errors/error-codes.js';
import { MAX_ENVELOPE_WITH_RECORD, stepAt, type Closing, type Execution, type StepOutcome } from './execution.js';

/**
 * How the step at `index` ends a root run when its record can carry the end (one commit instead of two), with the
 * envelope `StepLoop.runFrom` would store:
 * docs/design/audit-chain.md#a-calls-last-record-carries-its-settlement-and-its-runs-end.
 */
export function closingAt(
  exec: Execution,
  steps: StepResult[],
  warnings: string[],
  index: number,
): Closing | undefined {
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
export function endFor(
  exec: Execution,
  closing: Closing | undefined,
  step: StepResult,
  stop: StepOutcome['stop'],
  answered: { answer?: RunAnswer },
): RunEnding | undefined {
  const closed = closing?.(step, stop);
  if (!closed) return undefined;
  // Written once: its length decides whether the record carries the end, the end stores it, the reply sends it.
  const { answer, json } = writtenOnce(exec, closed);
  if (json.length > MAX_ENVELOPE_WITH_RECORD) return undefined;
  answered.answer = answer;
  const { run } = exec;
  return {
    tenant_id: run.tenant_id,
    run_id: run.run_id,
    epoch: run.epoch,
    status: answer.envelope.status,
    httpStatus: answer.httpStatus,
    envelope: answer.envelope,
    envelopeJson: json,
  };
}

/**
 * An answer's envelope written once, for the run's row (`json`) and the reply: by the door's serialiser when it has one
 * (the answer then carries that text), else by `JSON.stringify` for the row alone (the reply serialises as it will).
 */
export function writtenOnce(exec: Execution, answer: RunAnswer): { answer: RunAnswer; json: string } {
  let replyJson: string | undefined;
  try {
    replyJson = exec.answerJson?.(answer.httpStatus, answer.envelope);
  } catch {
    // The reply meets the same refusal and answers it as it would have.
  }
  return replyJson === undefined
    ? { answer, json: JSON.stringify(answer.envelope) }
    : { answer: { ...answer, json: replyJson }, json: replyJson };
}
