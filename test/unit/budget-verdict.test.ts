import { describe, expect, it } from 'vitest';
import { toMicros } from '../../src/budgets/budget-units.js';
import {
  decideReservation,
  exceededDetails,
  verdictFor,
  warningsOf,
  worstVerdict,
  type CounterLevel,
  type Limit,
} from '../../src/budgets/budget-verdict.js';

const u = toMicros;

function limit(counter: string, units: number, grace: number, warnRatio: number | null, budgetId = counter): Limit {
  return {
    counter,
    limitMicros: u(units),
    graceMicros: u(grace),
    warnRatio,
    label: warnRatio === null ? { source: 'request' } : { source: 'budget', budgetId, scope: 'tenant', period: 'day' },
  };
}

const levels = (entries: Record<string, [spent: number, reserved: number]>) =>
  new Map<string, CounterLevel>(
    Object.entries(entries).map(([k, [s, r]]) => [k, { spentMicros: u(s), reservedMicros: u(r) }]),
  );

describe('the verdict of one budget', () => {
  const budget = limit('b', 100, 10, 0.8);

  it('is ok below the warn ratio', () => {
    expect(verdictFor(budget, u(79.999999))).toBe('ok');
  });

  it('warns from warn_ratio × limit up to the limit itself', () => {
    expect(verdictFor(budget, u(80))).toBe('warn');
    expect(verdictFor(budget, u(100))).toBe('warn');
  });

  it('is grace past the limit, up to limit + grace', () => {
    expect(verdictFor(budget, u(100.000001))).toBe('grace');
    expect(verdictFor(budget, u(110))).toBe('grace');
  });

  it('is exceeded past limit + grace', () => {
    expect(verdictFor(budget, u(110.000001))).toBe('exceeded');
  });

  it('with no grace, is exceeded just past the limit', () => {
    expect(verdictFor(limit('b', 100, 0, 0.8), u(100))).toBe('warn');
    expect(verdictFor(limit('b', 100, 0, 0.8), u(100.000001))).toBe('exceeded');
  });

  it('never warns for a limit without a warn ratio (the request’s own)', () => {
    expect(verdictFor(limit('r', 100, 0, null), u(100))).toBe('ok');
  });

  it('compares decimals exactly', () => {
    // 0.1 + 0.2 units reach a 0.3 limit exactly: warn, not grace.
    expect(verdictFor(limit('b', 0.3, 0, 1), u(0.1) + u(0.2))).toBe('warn');
  });
});

describe('a reservation against every applicable limit', () => {
  it('takes the most severe verdict', () => {
    expect(worstVerdict(['ok', 'grace', 'warn'])).toBe('grace');
    expect(worstVerdict([])).toBe('ok');
    const decision = decideReservation(
      u(10),
      [limit('tenant', 1000, 0, 0.8), limit('agent', 100, 20, 0.5)],
      levels({ tenant: [100, 0], agent: [80, 15] }),
    );
    expect(decision).toMatchObject({ ok: true, verdict: 'grace' });
    expect(decision.checks.map((c) => c.verdict)).toEqual(['ok', 'grace']);
  });

  it('counts reserved units as well as spent ones', () => {
    const decision = decideReservation(u(1), [limit('b', 10, 0, 1)], levels({ b: [5, 5] }));
    expect(decision.ok).toBe(false);
  });

  it('refuses all or nothing: one exceeded limit refuses the reservation', () => {
    const decision = decideReservation(
      u(5),
      [limit('tenant', 1000, 0, 0.8), limit('run', 100, 0, null)],
      levels({ tenant: [0, 0], run: [96, 0] }),
    );
    expect(decision).toMatchObject({ ok: false, verdict: 'exceeded' });
    expect(exceededDetails(u(5), decision.checks)).toEqual({
      source: 'request',
      budget_id: null,
      scope: null,
      period: null,
      limit_units: 100,
      grace_units: 0,
      consumed_units: 96,
      requested_units: 5,
      exceeded_budget_ids: [],
    });
  });

  it('treats a counter never used as empty', () => {
    expect(decideReservation(u(10), [limit('b', 10, 0, 1)], new Map()).verdict).toBe('warn');
  });

  it('is ok with no limits at all', () => {
    expect(decideReservation(u(1_000_000), [], new Map())).toEqual({ ok: true, verdict: 'ok', checks: [] });
  });

  it('names every exceeded budget, the first one in detail', () => {
    const decision = decideReservation(u(2), [limit('bud_a', 1, 0, 1), limit('bud_b', 1, 0.5, 1)], new Map());
    const details = exceededDetails(u(2), decision.checks);
    expect(details).toMatchObject({
      source: 'budget',
      budget_id: 'bud_a',
      scope: 'tenant',
      period: 'day',
      limit_units: 1,
    });
    expect(details.exceeded_budget_ids).toEqual(['bud_a', 'bud_b']);
  });

  it('explains warnings and grace in the words the run envelope carries', () => {
    const decision = decideReservation(
      u(10),
      [limit('bud_w', 100, 0, 0.5), limit('bud_g', 50, 10, 0.8), limit('bud_ok', 1000, 0, 0.8)],
      levels({ bud_w: [45, 0], bud_g: [45, 0] }),
    );
    expect(warningsOf(decision.checks)).toEqual([
      'budget_warn: budget bud_w (tenant/day) at 55 of 100 units, past warn ratio 0.5',
      'budget_grace: budget bud_g (tenant/day) at 55 of 50 units, within 10 grace units',
    ]);
  });
});
