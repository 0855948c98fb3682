/**
 * Cost units are decimals with six places. Arithmetic on them is done in integer micro-units,
 * so that sums and limits compare exactly (0.1 + 0.2 is 0.3 here, as it is in PostgreSQL).
 */
export type Micros = number;

/**
 * The most units any one amount may be: a budget's limit or grace, a run's `budget_units`, a
 * hand-off's, a call's price or its reported cost. In micro-units that is 10^15, so a counter
 * holding a limit, its grace and one more call stays an exact integer in a double (below 2^53).
 */
export const MAX_UNITS = 1_000_000_000;

const SCALE = 1_000_000;

/** Units (a number, or PostgreSQL's numeric text) to micro-units, rounded to six places. */
export function toMicros(units: number | string): Micros {
  const value = typeof units === 'string' ? Number(units) : units;
  if (!Number.isFinite(value)) throw new RangeError(`not a number of units: ${String(units)}`);
  return Math.round(value * SCALE);
}

/** Micro-units back to units, as the API and the database see them. */
export function fromMicros(micros: Micros): number {
  return micros / SCALE;
}
