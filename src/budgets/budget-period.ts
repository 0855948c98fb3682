/** The window a budget counts over. Windows are calendar days and months in UTC. */
export const BUDGET_PERIODS = ['day', 'month', 'total'] as const;
export type BudgetPeriod = (typeof BUDGET_PERIODS)[number];

/** `total` has one window that began at the epoch and never ends. */
const EPOCH = new Date(0);

/** The start of the window that `at` falls in. */
export function periodStart(period: BudgetPeriod, at: Date): Date {
  switch (period) {
    case 'day':
      return new Date(Date.UTC(at.getUTCFullYear(), at.getUTCMonth(), at.getUTCDate()));
    case 'month':
      return new Date(Date.UTC(at.getUTCFullYear(), at.getUTCMonth(), 1));
    case 'total':
      return EPOCH;
  }
}

/** The end (exclusive) of the window that `at` falls in; null for `total`, which never resets. */
export function periodEnd(period: BudgetPeriod, at: Date): Date | null {
  switch (period) {
    case 'day':
      return new Date(Date.UTC(at.getUTCFullYear(), at.getUTCMonth(), at.getUTCDate() + 1));
    case 'month':
      return new Date(Date.UTC(at.getUTCFullYear(), at.getUTCMonth() + 1, 1));
    case 'total':
      return null;
  }
}
