/** The first day of the month `ahead` months after this one (UTC): the migrations gave months 1–3 their own partitions. */
export function monthStart(ahead: number): Date {
  const now = new Date();
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + ahead, 1));
}

/** The name of the partition holding a month. */
export const partitionOf = (month: Date): string =>
  `audit_events_${month.getUTCFullYear()}_${String(month.getUTCMonth() + 1).padStart(2, '0')}`;

export const days = (n: number): number => n * 24 * 60 * 60 * 1000;
