/**
 * Cost units are decimals with six places. Arithmetic on them is done in integer micro-units,
 * so that sums and limits compare exactly (0.1 + 0.2 is 0.3 here, as it is in PostgreSQL).
 */
export type Micros = number;

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
