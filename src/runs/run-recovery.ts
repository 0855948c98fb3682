import type { Logger } from 'pino';
import { Counter, type Registry } from 'prom-client';
import { listRunCallRecords, type RunCallRecord } from '../audit/audit-listing.js';
import { writeAuditEvents } from '../audit/audit-repository.js';
import { closeLostRunReservations } from '../budgets/reservation-close-repository.js';
import { lockRunTreeLedger } from '../budgets/run-allowance.js';
import { BackgroundTask } from '../db/background-task.js';
import { retryOnConflict } from '../db/group-commit.js';
import { statusForCode, type ErrorCode } from '../errors/error-codes.js';
import { attributionOf, endRunTrees } from './run-lifecycle.js';
import { releaseLostRun } from './run-end-repository.js';
import {
  findBusyRunsToCheck,
  lockOpenRunTrees,
  lockRun,
  replicaAlive,
  type RunKey,
  type RunRecord,
} from './run-repository.js';
import {
  isTerminal,
  stepIndexOfToolCall,
  type RunEnvelope,
  type RunStatus,
  type RunStop,
  type StepResult,
} from './run-types.js';
import type { Database } from '../db/database.js';
import { changeInLockOrder } from '../db/lock-order.js';

/** The audit actor of recovery: no operator ended these runs; their executor was lost. */
export const RECOVERY_ACTOR = 'system.recovery';

const BATCH = 100;

/**
 * How many times a recovery starts over when a reservation of the run's tree was recorded while
 * it locked the ledger; the last attempt goes on regardless, and locks that one when it meets it.
 */
const LEDGER_ATTEMPTS = 3;

/** A reservation was recorded while recovery locked the ledger: its transaction starts over. */
class LedgerMoved extends Error {}

/**
 * How much earlier than its run a call's record may be dated (clocks disagree by far less). Retention frees a run id
 * only weeks after its run, so a deleted run's records under the id are never taken for the new run's.
 */
const CLOCK_SKEW_MARGIN_MS = 86_400_000;

/** What recovery is built from, by the composition root. */
export interface RunRecoveryOptions {
  database: Database;
  /** This replica: the executor id its claims record. */
  replicaId: string;
  now: () => Date;
  intervalMs: number;
  logger: Logger;
  registry: Registry;
}

/**
 * Ends runs left busy by an executor that is gone, never executing them again; the run's lock
 * makes each recovery happen once. How the run, its budget and its records end: docs/design/run-recovery.md.
 */
export class RunRecovery {
  /** Runs this replica's executor is executing now, by key, with how many requests hold each. */
  private readonly executing = new Map<string, number>();
  private readonly recovered: Counter;
  private readonly task: BackgroundTask;

  constructor(private readonly options: RunRecoveryOptions) {
    this.recovered = new Counter({
      name: 'toolgate_runs_recovered_total',
      help: 'Busy runs whose executor was lost (replica gone, or execution broken off), ended by recovery',
      registers: [options.registry],
    });
    this.task = new BackgroundTask({
      name: 'run recovery sweep',
      run: () => this.sweep(),
      intervalMs: () => options.intervalMs,
      logger: options.logger,
    });
  }

  /**
   * Marks a run as executed by this replica until the returned function is called. Call it
   * before the run is claimed or taken up, and release it after the executor let go of the run
   * (or gave up on it): a busy run of this replica that is not marked is lost.
   */
  track(key: RunKey): () => void {
    const k = keyOf(key);
    this.executing.set(k, (this.executing.get(k) ?? 0) + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = this.executing.get(k)! - 1;
      if (left === 0) this.executing.delete(k);
      else this.executing.set(k, left);
    };
  }

  start(): void {
    this.task.start();
  }

  stop(): Promise<void> {
    return this.task.stop();
  }

  /** Ends every lost run found now; returns how many it ended. */
  async sweep(): Promise<number> {
    let count = 0;
    let after: RunKey | undefined;
    for (;;) {
      const page = await findBusyRunsToCheck(this.options.database.control, this.options.replicaId, BATCH, after);
      for (const run of page) {
        // This replica's own runs are lost only once it no longer executes them.
        if (run.executor_id === this.options.replicaId && this.executing.has(keyOf(run))) continue;
        if (await this.recoverIfLost(run)) count += 1;
      }
      if (page.length < BATCH) return count;
      after = page[page.length - 1];
    }
  }

  /**
   * Ends the run if it is busy and its executor is lost; whether it did. `callerHolds`: how many
   * of this replica's marks on the run are the caller's own (a request asking about the run it
   * has marked), which do not count as executing it.
   */
  async recoverIfLost(key: RunKey, callerHolds = 0): Promise<boolean> {
    const now = this.options.now();
    for (let attempt = 1; ; attempt += 1) {
      try {
        // Chosen as a deadlock's victim (a writer that locks out of order, or the last attempt
        // locking a late reservation after counters), it committed nothing: it runs again, rather
        // than failing the owner's resubmission with a 500 or losing the sweep's round.
        return await retryOnConflict(() => this.recoverOnce(key, callerHolds, now, attempt === LEDGER_ATTEMPTS));
      } catch (error) {
        if (!(error instanceof LedgerMoved)) throw error;
      }
    }
  }

  /** One attempt of `recoverIfLost`, in one transaction; `lastAttempt`: it does not start over. */
  private async recoverOnce(key: RunKey, callerHolds: number, now: Date, lastAttempt: boolean): Promise<boolean> {
    const done = await changeInLockOrder(this.options.database.control, async (trx) => {
      const run = await lockRun(trx, key);
      if (!run || !run.busy || run.executor_id === null) return false;
      const lost =
        run.executor_id === this.options.replicaId
          ? (this.executing.get(keyOf(run)) ?? 0) <= callerHolds
          : !(await replicaAlive(trx, run.executor_id));
      if (!lost) return false;

      const since = new Date(new Date(run.created_at).getTime() - CLOCK_SKEW_MARGIN_MS);
      const calls = await listRunCallRecords(trx, run.tenant_id, run.run_id, run.epoch, since);
      const inDoubt = callsInDoubt(calls);
      const loss = {
        reason: 'executor_lost',
        executor_id: run.executor_id,
        in_doubt_tool_call_ids: inDoubt.map((call) => call.tool_call_id),
      };
      let status: RunStatus;
      let stop: RunStop | undefined;
      let httpStatus: number;
      const rebuilt = rebuildSteps(run, calls);
      // A run kept open whose plan completed rests where its executor would have left it.
      const resting = rebuilt.allCompleted && run.keep_open;
      if (!isTerminal(run.status) && !resting) {
        status = rebuilt.allCompleted ? 'completed' : 'failed';
        const cause = {
          code: (rebuilt.allCompleted ? 'run_not_resumable' : 'gateway_unavailable') as ErrorCode,
          message: `the replica executing run ${run.run_id} stopped before the run ended${inDoubt.length > 0 ? '; a call in doubt may have reached its backend' : ''}`,
          details: loss,
        };
        // An executor taken for lost may be alive and settling its call, and its sub-runs'
        // executors reserving theirs: a settlement locks its reservation, then counters; a
        // reservation locks its counters, in key order. The reservations this recovery closes (the
        // run's own) or recharges (its sub-runs', as their hand-offs close) are locked first, then
        // every counter it changes, in one statement in key order, before endRunTrees changes any.
        const tree = await lockOpenRunTrees(trx, [run]);
        if (!(await lockRunTreeLedger(trx, tree)) && !lastAttempt) throw new LedgerMoved();
        const [ended] = await endRunTrees(
          trx,
          { roots: [run], status, stop: cause, eventType: 'run.executor_lost', actor: RECOVERY_ACTOR },
          now,
        );
        stop = { ...cause, audit_id: ended!.audit_id };
        httpStatus = status === 'completed' ? 200 : statusForCode(cause.code);
      } else {
        // A control or cascade ended it while its executor was gone (that end stands), or it rests.
        status = run.status;
        const [record] = await writeAuditEvents(trx, [
          {
            occurredAt: now,
            event: {
              event_type: 'run.executor_lost',
              actor: RECOVERY_ACTOR,
              tenant_id: run.tenant_id,
              agent_id: run.agent_id,
              run_id: run.run_id,
              status: run.status,
              reason_code: 'gateway_unavailable',
              details: { ...loss, run_depth: run.depth, attribution: attributionOf(run) },
            },
          },
        ]);
        if (isTerminal(run.status)) {
          stop = run.stop ?? {
            code: 'run_not_resumable',
            message: `the run is ${run.status}`,
            details: { status: run.status },
            audit_id: record!.event_id,
          };
          httpStatus = run.http_status ?? statusForCode(stop.code);
        } else {
          httpStatus = run.status === 'running' ? 200 : 202;
        }
      }
      // The reservation of the call in hand: charged if the call may have been made, else given
      // back; one whose call's outcome was recorded (its settlement lost) at what the record says.
      const reservationsClosed = await closeLostRunReservations(
        trx,
        run.tenant_id,
        run.run_id,
        inDoubt.length > 0 ? 'charge' : 'release',
        now,
      );
      const envelope: RunEnvelope = {
        run_id: run.run_id,
        status,
        dry_run: false,
        steps: stop ? finishSteps(run, rebuilt.steps, stop) : rebuilt.steps,
        warnings: [...(run.envelope?.warnings ?? []), 'executor_lost'],
      };
      await releaseLostRun(trx, run, { httpStatus, envelope });
      return { run_id: run.run_id, tenant_id: run.tenant_id, ...loss, reservations_closed: reservationsClosed };
    });
    if (!done) return false;
    this.recovered.inc();
    this.options.logger.warn(done, 'ended a run whose executor was lost');
    return true;
  }
}

/** Calls whose intent was recorded and whose outcome was not: they may have reached their backend. */
function callsInDoubt(calls: RunCallRecord[]): RunCallRecord[] {
  const ended = new Set(calls.filter((call) => call.status !== 'dispatching').map((call) => call.tool_call_id));
  return calls.filter((call) => call.status === 'dispatching' && !ended.has(call.tool_call_id));
}

/**
 * What the lost execution got to, from the stored envelope's completed steps and the audit
 * records of the execution: the steps it completed, then the step it stopped at, if any.
 */
function rebuildSteps(run: RunRecord, calls: RunCallRecord[]): { steps: StepResult[]; allCompleted: boolean } {
  const plan = run.request?.plan ?? [];
  const stored = run.envelope?.steps ?? [];
  const firstOpen = stored.findIndex((step) => step.status !== 'completed');
  const steps: StepResult[] = firstOpen === -1 ? [...stored] : stored.slice(0, firstOpen);
  // The last call made at each step, with its outcome if it has one.
  const byStep = new Map<number, { call: RunCallRecord; ended?: RunCallRecord }>();
  for (const call of calls) {
    const index = stepIndexOfToolCall(call.tool_call_id ?? '');
    if (call.status === 'dispatching' || byStep.get(index)?.call.tool_call_id !== call.tool_call_id)
      byStep.set(index, { call });
    if (call.status !== 'dispatching') byStep.get(index)!.ended = call;
  }
  for (let index = steps.length; index < plan.length; index += 1) {
    const entry = byStep.get(index);
    if (!entry) break;
    const head = { index, tool_id: plan[index]!.tool_id, version: entry.call.tool_version };
    const record = entry.ended ?? entry.call;
    const cost = Number(record.cost_units ?? 0);
    const duration = Number(record.duration_ms ?? 0);
    if (record.status === 'completed') {
      steps.push({ ...head, status: 'completed', cost_units: cost, duration_ms: duration, audit_id: record.event_id });
      continue;
    }
    if (record.status === 'dispatching') {
      steps.push({
        ...head,
        status: 'failed',
        error: {
          code: 'gateway_unavailable',
          message:
            'the replica executing this call stopped before its outcome was recorded; the call may have reached its backend',
          details: { reason: 'executor_lost', in_doubt: true, tool_call_id: record.tool_call_id },
        },
        cost_units: 0,
        duration_ms: 0,
        audit_id: record.event_id,
      });
    } else {
      const code = (record.reason_code ?? 'gateway_unavailable') as ErrorCode;
      steps.push({
        ...head,
        status: record.status === 'failed' ? 'failed' : 'denied',
        error: { code, message: record.message ?? code, details: {} },
        cost_units: record.status === 'failed' ? cost : 0,
        duration_ms: duration,
        audit_id: record.event_id,
      });
    }
    return { steps, allCompleted: false };
  }
  return { steps, allCompleted: steps.length === plan.length && plan.length > 0 };
}

/** The rest of the plan: the step the run stopped at (unless a rebuilt step already says why), then skipped. */
function finishSteps(run: RunRecord, rebuilt: StepResult[], stop: RunStop): StepResult[] {
  const plan = run.request?.plan ?? [];
  const steps = [...rebuilt];
  const last = steps[steps.length - 1];
  if (steps.length < plan.length && (!last || last.status === 'completed')) {
    steps.push({
      index: steps.length,
      tool_id: plan[steps.length]!.tool_id,
      version: null,
      status: 'denied',
      error: { code: stop.code, message: stop.message, details: { ...stop.details, in_doubt: false } },
      cost_units: 0,
      duration_ms: 0,
      audit_id: stop.audit_id,
    });
  }
  for (let index = steps.length; index < plan.length; index += 1) {
    steps.push({
      index,
      tool_id: plan[index]!.tool_id,
      version: null,
      status: 'skipped',
      cost_units: 0,
      duration_ms: 0,
      audit_id: null,
    });
  }
  return steps;
}

function keyOf(key: RunKey): string {
  return `${key.tenant_id}\u0000${key.run_id}`;
}
