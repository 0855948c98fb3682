import { budgetApplies, runCounterKey, type Budget, type ChargeSubject } from './budget.js';
import { counterId, type CounterRef } from './budget-counter-repository.js';
import { periodStart } from './budget-period.js';
import type { CounterLevel } from './budget-verdict.js';

/** Past this many entries, a map is emptied rather than grown (it only holds guesses). */
const MAX_ENTRIES = 10_000;

/** The counter of a run's own running total (checked against the request's `budget_units`). */
export function runTotalCounter(subject: ChargeSubject): CounterRef {
  return { key: runCounterKey(subject.tenantId, subject.runId), periodStart: periodStart('total', new Date(0)) };
}

/** The run totals these subjects keep. */
export function keptRunTotals(subjects: ChargeSubject[]): CounterRef[] {
  return subjects.filter((subject) => subject.keepsRunTotal !== false).map(runTotalCounter);
}

/**
 * What this replica last saw of the live budgets and counter levels it charges: guesses that spare a batch its read,
 * never facts — `writeLedgerIf` checks them, so a stale guess costs a read, never a wrong decision.
 */
export class KnownLedger {
  /** Tenant- and agent-scope budgets, per (tenant, agent). */
  private readonly agentBudgets = new Map<string, Budget[]>();
  /** Run-scope budgets, per (tenant, run); a run missing here is guessed to have none. */
  private readonly runBudgets = new Map<string, Budget[]>();
  /** Levels of budgets' counters, per counter id. */
  private readonly budgetLevels = new Map<string, CounterLevel>();
  /** Levels of runs' own totals; a run missing here is guessed to have none yet (a new run). */
  private readonly runLevels = new Map<string, CounterLevel>();

  /**
   * The budgets that apply to these subjects and the levels of the counters they charge, as
   * last seen; undefined when some of it was never seen (a new agent, a new period window).
   * A run total missing from the levels is guessed not to exist.
   */
  guess(subjects: ChargeSubject[], now: Date): { budgets: Budget[]; levels: Map<string, CounterLevel> } | undefined {
    const budgets = new Map<string, Budget>();
    for (const subject of subjects) {
      const own = this.agentBudgets.get(agentKey(subject));
      if (!own) return undefined;
      for (const budget of own) budgets.set(budget.id, budget);
      for (const budget of this.runBudgets.get(runKey(subject)) ?? []) budgets.set(budget.id, budget);
    }
    const levels = new Map<string, CounterLevel>();
    for (const budget of budgets.values()) {
      const id = counterId({ key: budget.id, periodStart: periodStart(budget.period, now) });
      const level = this.budgetLevels.get(id);
      if (!level) return undefined;
      levels.set(id, level);
    }
    for (const total of keptRunTotals(subjects)) {
      const id = counterId(total);
      const level = this.runLevels.get(id);
      if (level) levels.set(id, level);
    }
    return { budgets: [...budgets.values()], levels };
  }

  /** What a read (or a locked decision) saw: the budgets that may apply to the subjects, and levels. */
  remember(subjects: ChargeSubject[], budgets: Budget[], levels: ReadonlyMap<string, CounterLevel>): void {
    for (const subject of subjects) {
      const applicable = budgets.filter((budget) => budgetApplies(budget, subject));
      keep(
        this.agentBudgets,
        agentKey(subject),
        applicable.filter((budget) => budget.scope !== 'run'),
      );
      const own = applicable.filter((budget) => budget.scope === 'run');
      if (own.length > 0) keep(this.runBudgets, runKey(subject), own);
      else this.runBudgets.delete(runKey(subject));
    }
    this.rememberLevels(levels);
  }

  /** Levels this replica has just written or read. */
  rememberLevels(levels: ReadonlyMap<string, CounterLevel>): void {
    for (const [id, level] of levels) keep(id.startsWith('run/') ? this.runLevels : this.budgetLevels, id, level);
  }

  /** Drops what turned out stale: the subjects' budgets and these counters' levels. */
  forget(subjects: ChargeSubject[], counters: Iterable<string>): void {
    for (const subject of subjects) {
      this.agentBudgets.delete(agentKey(subject));
      this.runBudgets.delete(runKey(subject));
    }
    for (const id of counters) {
      this.budgetLevels.delete(id);
      this.runLevels.delete(id);
    }
  }
}

// Tenant ids never contain '/', so these keys are unambiguous whatever agent and run ids hold.
const agentKey = (subject: ChargeSubject) => `${subject.tenantId}/${subject.agentId}`;
const runKey = (subject: ChargeSubject) => `${subject.tenantId}/${subject.runId}`;

function keep<V>(map: Map<string, V>, key: string, value: V): void {
  if (map.size >= MAX_ENTRIES && !map.has(key)) map.clear();
  map.set(key, value);
}
