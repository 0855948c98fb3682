import { describe, expect, it } from 'vitest';
import { periodEnd, periodStart } from '../../src/budgets/budget-period.js';
import { fromMicros, toMicros } from '../../src/budgets/budget-units.js';

const at = new Date('2030-03-31T23:59:59.999Z');

describe('budget periods', () => {
  it('are UTC calendar days', () => {
    expect(periodStart('day', at).toISOString()).toBe('2030-03-31T00:00:00.000Z');
    expect(periodEnd('day', at)?.toISOString()).toBe('2030-04-01T00:00:00.000Z');
    expect(periodStart('day', new Date('2030-04-01T00:00:00.000Z')).toISOString()).toBe('2030-04-01T00:00:00.000Z');
  });

  it('are UTC calendar months, across year ends', () => {
    expect(periodStart('month', at).toISOString()).toBe('2030-03-01T00:00:00.000Z');
    expect(periodEnd('month', at)?.toISOString()).toBe('2030-04-01T00:00:00.000Z');
    expect(periodEnd('month', new Date('2030-12-15T12:00:00Z'))?.toISOString()).toBe('2031-01-01T00:00:00.000Z');
  });

  it('has one total window that never ends', () => {
    expect(periodStart('total', at).getTime()).toBe(0);
    expect(periodStart('total', new Date('1999-01-01T00:00:00Z')).getTime()).toBe(0);
    expect(periodEnd('total', at)).toBeNull();
  });
});

describe('budget units', () => {
  it('are exact to six decimal places', () => {
    expect(toMicros(0.1) + toMicros(0.2)).toBe(toMicros(0.3));
    expect(toMicros('12.500000')).toBe(12_500_000);
    expect(fromMicros(toMicros(1.0000004))).toBe(1);
    expect(fromMicros(toMicros(1.0000005))).toBe(1.000001);
  });

  it('refuse what is not a number', () => {
    expect(() => toMicros(Number.NaN)).toThrow(RangeError);
    expect(() => toMicros('abc')).toThrow(RangeError);
  });
});
