import { InvalidArgumentError } from 'commander';
import { printable } from './terminal.js';
import type { z } from 'zod';

const UNIT_SECONDS = { s: 1, m: 60, h: 3_600, d: 86_400, w: 604_800 } as const;

/** `90s`, `15m`, `12h`, `7d`, `2w` as seconds: the unit is required, so that `7` is never a surprise. */
export function parseDuration(text: string): number {
  const match = /^(\d+)([smhdw])$/.exec(text.trim());
  const seconds = match ? Number(match[1]) * UNIT_SECONDS[match[2] as keyof typeof UNIT_SECONDS] : NaN;
  if (!Number.isSafeInteger(seconds) || seconds <= 0)
    throw new InvalidArgumentError('expected a duration such as 90s, 15m, 12h, 7d or 2w');
  return seconds;
}

/** A duration, or a bare number of seconds (as `npm run token -- --ttl 3600` always took). */
export function parseSecondsOrDuration(text: string): number {
  return /^\d+$/.test(text.trim()) ? parseDuration(`${text.trim()}s`) : parseDuration(text);
}

/**
 * An option parsed by the schema the gateway's doors bound the field with (`src/validation/fields.ts`): a value the
 * server would refuse is a usage error here, before anything is sent.
 */
export function parseField(schema: z.ZodType<string>): (text: string) => string {
  return (text) => {
    const parsed = schema.safeParse(text);
    if (!parsed.success) throw new InvalidArgumentError(parsed.error.issues[0]?.message ?? 'invalid');
    return parsed.data;
  };
}

export function parseNumber(text: string): number {
  const value = Number(text);
  if (text.trim() === '' || !Number.isFinite(value)) throw new InvalidArgumentError('expected a number');
  return value;
}

export function parseInteger(text: string): number {
  const value = parseNumber(text);
  if (!Number.isSafeInteger(value)) throw new InvalidArgumentError('expected a whole number');
  return value;
}

export function parseBoolean(text: string): boolean {
  if (['true', 'on', 'yes'].includes(text)) return true;
  if (['false', 'off', 'no'].includes(text)) return false;
  throw new InvalidArgumentError('expected true or false');
}

export function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new InvalidArgumentError('expected JSON');
  }
}

/** `key=value`, collected into an object (repeatable options). */
export function collectPair(text: string, into: Record<string, string> = {}): Record<string, string> {
  const at = text.indexOf('=');
  if (at <= 0) throw new InvalidArgumentError('expected key=value');
  return { ...into, [text.slice(0, at)]: text.slice(at + 1) };
}

export function collect(text: string, into: string[] = []): string[] {
  return [...into, text];
}

/** One cell, on one line: nothing as `-`, objects as compact JSON, control characters escaped. */
export function cell(value: unknown): string {
  if (value === null || value === undefined || value === '') return '-';
  return printable(typeof value === 'object' ? JSON.stringify(value) : String(value));
}

/** Columns aligned with spaces, like `kubectl get`: easy to read, and to cut with awk. */
export function table(headers: string[], rows: unknown[][]): string {
  const cells = [headers, ...rows.map((row) => row.map(cell))];
  const widths = headers.map((_, i) => Math.max(...cells.map((row) => row[i]!.length)));
  return cells
    .map((row) => row.map((text, i) => (i === row.length - 1 ? text : text.padEnd(widths[i]!))).join('  '))
    .join('\n');
}

/** One resource as `field: value` lines, the API's field names on the left. */
export function record(value: Record<string, unknown>): string {
  const width = Math.max(...Object.keys(value).map((key) => key.length));
  return Object.entries(value)
    .map(([key, field]) => `${`${key}:`.padEnd(width + 1)} ${cell(field)}`)
    .join('\n');
}
