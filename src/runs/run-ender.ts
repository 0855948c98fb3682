import type { AuditEventInput } from '../audit/audit-event.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { GroupCommit, retryOnConflict } from '../db/group-commit.js';
import { statusForCode } from '../errors/error-codes.js';
import { followRunEnd } from './run-lifecycle.js';
import { releaseRun, endRuns, type RunEnding } from './run-end-repository.js';
import { readRunStanding } from './run-repository.js';
import {
  isTerminal,
  type RunEnvelope,
  type RunStatus,
  type RunStop,
  type StepResult,
  type TerminalStatus,
} from './run-types.js';
import { changeInLockOrder } from '../db/lock-order.js';
import { stepAt, type Execution, type RunExecutorDeps } from './execution.js';
import { writtenOnce } from './step-closing.js';
import type { RunAnswer } from './run-types.js';

/** Lets go of a run: where it got to, stored for replays; a run that ends takes its sub-runs and hand-off with it. */
export class RunEnder {
  /** Ends of runs that happen at the same moment share one statement (group commit). */
  private readonly ends: GroupCommit<RunEnding, boolean>;

  constructor(private readonly deps: RunExecutorDeps) {
    this.ends = new GroupCommit((endings) => retryOnConflict(() => endRuns(deps.database.hot, endings)));
  }

  /**
   * The run moved on between calls — a control or a cascade, from any replica: a stopped run
   * refuses its next step with the reason it was stopped; a paused one keeps it pending.
   */
  async interrupted(
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
    const { answer, json } = writtenOnce(exec, { httpStatus, envelope, replayed: false });
    await releaseRun(this.deps.database.control, exec.run, { httpStatus, envelope, envelopeJson: json });
    return answer;
  }

  /**
   * Lets go of the run with where it got to. Ending it with sub-runs or a hand-off needs the chain head first, so
   * that is redone in lock order when needed; `ending` commits with the end, or not at all if the run moved on.
   */
  async end(
    exec: Execution,
    httpStatus: number,
    envelope: RunEnvelope,
    ending: AuditEventInput[] = [],
  ): Promise<RunAnswer> {
    const { run } = exec;
    const status = envelope.status;
    const { answer, json } = writtenOnce(exec, { httpStatus, envelope, replayed: false });
    if (!isTerminal(status)) {
      if (ending.length > 0)
        throw new Error(`run ${run.run_id}: events recorded with an end, but it does not end (${status})`);
      if (await releaseRun(this.deps.database.control, run, { status, httpStatus, envelope, envelopeJson: json }))
        return answer;
    } else {
      const change = { status, httpStatus, envelope, envelopeJson: json };
      const left = await this.leaveTerminal(exec, change, run.depth > 0 || ending.length > 0, ending);
      if (left === 'retry' ? await this.leaveTerminal(exec, change, true, ending) : left) return answer;
    }
    // Stopped or paused between the last call and now: the run is someone else's to describe.
    const standing = await readRunStanding(this.deps.database.control, run);
    const done = envelope.steps.filter((s) => s.status === 'completed');
    return this.interrupted(exec, done, envelope.warnings, standing?.status ?? 'cancelled', standing?.stop ?? null);
  }

  async leaveTerminal(
    exec: Execution,
    change: { status: TerminalStatus; httpStatus: number; envelope: RunEnvelope; envelopeJson?: string | undefined },
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
}
