import { describe, expect, it } from 'vitest';
import {
  assertRule,
  fullBucket,
  refill,
  secondsUntilToken,
  take,
  type BucketRule,
  type BucketState,
} from '../../src/rate-limits/token-bucket.js';

const rule: BucketRule = { capacity: 3, refillPerSecond: 0.5 };
const T0 = Date.UTC(2030, 0, 1);

/** Takes at each instant in turn, threading the state; returns what each take answered. */
function takeAt(instantsMs: number[], from: BucketState = fullBucket(rule, T0), r: BucketRule = rule) {
  let state = from;
  return instantsMs.map((at) => {
    const decision = take(state, r, at);
    state = decision.state;
    return decision;
  });
}

describe('a token bucket', () => {
  it('starts full and admits a burst of exactly its capacity', () => {
    const decisions = takeAt([T0, T0, T0, T0]);
    expect(decisions.map((d) => d.ok)).toEqual([true, true, true, false]);
    expect(decisions.map((d) => d.remaining)).toEqual([2, 1, 0, 0]);
  });

  it('refills at its rate, never past capacity', () => {
    const empty = { tokens: 0, updatedAtMs: T0 };
    expect(refill(empty, rule, T0 + 1000).tokens).toBeCloseTo(0.5, 12);
    expect(refill(empty, rule, T0 + 4000).tokens).toBe(2);
    expect(refill(empty, rule, T0 + 3_600_000).tokens).toBe(3);
  });

  it('gives the exact Retry-After: seconds until one token, rounded up', () => {
    const [, , , denied] = takeAt([T0, T0, T0, T0]);
    // Empty at 0.5 tokens/s: a token in exactly 2 s.
    expect(denied).toMatchObject({ ok: false, retryAfterSeconds: 2 });
    const later = take({ tokens: 0, updatedAtMs: T0 }, rule, T0 + 500);
    // 0.25 tokens: 1.5 s to go, rounded up.
    expect(later).toMatchObject({ ok: false, retryAfterSeconds: 2 });
    const almost = take({ tokens: 0, updatedAtMs: T0 }, rule, T0 + 1999);
    expect(almost).toMatchObject({ ok: false, retryAfterSeconds: 1 });
  });

  it('admits again exactly when Retry-After has passed', () => {
    const [, , , denied] = takeAt([T0, T0, T0, T0]);
    if (denied!.ok) throw new Error('expected a denial');
    const retryAt = T0 + denied!.retryAfterSeconds * 1000;
    expect(take(denied!.state, rule, retryAt - 1).ok).toBe(false);
    expect(take(denied!.state, rule, retryAt).ok).toBe(true);
  });

  it('does not round a whole number of seconds up by floating-point noise', () => {
    // 0.7 tokens at 0.1/s: 3 s to go, though (1 - 0.7) / 0.1 is 3.0000000000000004 in doubles.
    expect(secondsUntilToken({ tokens: 0.7, updatedAtMs: T0 }, { capacity: 1, refillPerSecond: 0.1 })).toBe(3);
    // 0.1 + 0.2 + 0.7 tokens is one token.
    expect(take({ tokens: 0.1 + 0.2 + 0.7, updatedAtMs: T0 }, rule, T0).ok).toBe(true);
  });

  it('never admits more than capacity + refill × elapsed over any run of takes', () => {
    const fast: BucketRule = { capacity: 5, refillPerSecond: 7 };
    let state = fullBucket(fast, T0);
    let admitted = 0;
    // A take every 13 ms for 10 s.
    for (let at = T0; at <= T0 + 10_000; at += 13) {
      const decision = take(state, fast, at);
      state = decision.state;
      if (decision.ok) admitted += 1;
    }
    expect(admitted).toBeLessThanOrEqual(5 + 7 * 10);
    expect(admitted).toBeGreaterThanOrEqual(5 + 7 * 10 - 1);
  });

  it('refills nothing for a clock that reads earlier than the last update', () => {
    const state = { tokens: 0, updatedAtMs: T0 + 5000 };
    const decision = take(state, rule, T0);
    expect(decision.ok).toBe(false);
    expect(decision.state.updatedAtMs).toBe(T0 + 5000);
    expect(refill(state, rule, T0 + 7000).tokens).toBe(1);
  });

  it('rejects rules no bucket can honour', () => {
    expect(() => assertRule({ capacity: 0, refillPerSecond: 1 })).toThrow(RangeError);
    expect(() => assertRule({ capacity: 0.5, refillPerSecond: 1 })).toThrow(RangeError);
    expect(() => assertRule({ capacity: 1, refillPerSecond: 0 })).toThrow(RangeError);
    expect(() => assertRule({ capacity: 1, refillPerSecond: Number.NaN })).toThrow(RangeError);
    expect(() => assertRule({ capacity: 1, refillPerSecond: 0.01 })).not.toThrow();
  });
});
