/** An ISO 8601 duration such as `P30D`, `P1M`, `PT12H` or `P1Y2M3W4DT5H6M7.5S`. */
export interface IsoDuration {
  years: number;
  months: number;
  weeks: number;
  days: number;
  hours: number;
  minutes: number;
  seconds: number;
}

const DURATION = /^P(?:(\d+)Y)?(?:(\d+)M)?(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:[.,]\d+)?)S)?)?$/;

/** Parses an ISO 8601 duration; undefined when the text is not one (`P`, `PT`, `P1.5D`, `-P1D`). */
export function parseIsoDuration(text: string): IsoDuration | undefined {
  const match = DURATION.exec(text);
  if (!match || text === 'P' || text.endsWith('T')) return undefined;
  const [years, months, weeks, days, hours, minutes] = match.slice(1, 7).map((part) => Number(part ?? 0)) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  const seconds = Number((match[7] ?? '0').replace(',', '.'));
  return { years, months, weeks, days, hours, minutes, seconds };
}

/** About how many years a duration spans (a month a twelfth of a year, a day 1/365): for bounds. */
export function approximateYears(d: IsoDuration): number {
  return d.years + d.months / 12 + (d.weeks * 7 + d.days) / 365 + (d.hours + d.minutes / 60 + d.seconds / 3600) / 8760;
}

/**
 * `date` moved by a duration, forwards (`sign` 1) or backwards (-1), in calendar terms: a month
 * is a calendar month (UTC), not thirty days.
 */
export function shiftBy(date: Date, duration: IsoDuration, sign: 1 | -1): Date {
  const shifted = new Date(date.getTime());
  shifted.setUTCFullYear(
    shifted.getUTCFullYear() + sign * duration.years,
    shifted.getUTCMonth() + sign * duration.months,
  );
  shifted.setUTCDate(shifted.getUTCDate() + sign * (duration.weeks * 7 + duration.days));
  const ms = ((duration.hours * 60 + duration.minutes) * 60 + duration.seconds) * 1000;
  return new Date(shifted.getTime() + sign * ms);
}

/** The review window around `now`: deprecations that took effect or take effect within the duration. */
export function reviewWindow(now: Date, duration: IsoDuration): { from: Date; to: Date } {
  return { from: shiftBy(now, duration, -1), to: shiftBy(now, duration, 1) };
}
