import { z } from 'zod';
import { MAX_UNITS, toMicros } from '../budgets/budget-units.js';

// Value shapes the domain validates too (a tool contract's dates, a grant's unit caps), not only requests.

export const INSTANT_YEARS = 'must fall within the years 0000 to 9999 in UTC';
export const POSITIVE_UNITS = 'must be positive (at least 0.000001)';
export const UNITS = 'must be 0 or at least 0.000001';

/**
 * An RFC 3339 instant (offset allowed) whose UTC form has a four-digit year: what the API writes
 * back (`…Z`) must be an RFC 3339 date-time too, which `9999-12-31T23:00:00-02:00` would not be.
 */
export const instant = z.iso.datetime({ offset: true }).refine(isWrittenBack, INSTANT_YEARS);

/** Whether an RFC 3339 instant's UTC form is one too: its year has four digits. */
export function isWrittenBack(value: string): boolean {
  const year = new Date(value).getUTCFullYear();
  return year >= 0 && year <= 9999;
}

/** A positive amount of units: six decimal places, so anything that rounds to zero is not one. */
export const positiveUnits = z.number().max(MAX_UNITS).refine(isPositiveUnits, POSITIVE_UNITS);

/** Whether an amount is a positive one at six decimal places: a finer one rounds to zero. */
export function isPositiveUnits(value: number): boolean {
  return toMicros(value) > 0;
}

/** An amount of units, zero included: six decimal places, so a positive one is at least 0.000001. */
export const units = z.number().min(0).max(MAX_UNITS).refine(isUnits, UNITS);

/** Whether an amount is 0 or at least 0.000001: six decimal places, so a finer one is neither. */
export function isUnits(value: number): boolean {
  return value === 0 || toMicros(value) > 0;
}
