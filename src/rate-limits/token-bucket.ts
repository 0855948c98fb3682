/**
 * Token-bucket arithmetic, pure: a bucket holds up to `capacity` tokens, gains
 * `refillPerSecond` tokens per second, and each admitted call takes one. Over any interval of
 * length t, a bucket that started full admits at most `capacity + refillPerSecond × t` calls.
 */
export interface BucketRule {
  capacity: number;
  refillPerSecond: number;
}

/** A bucket's level, as of `updatedAtMs` (milliseconds since the epoch). */
export interface BucketState {
  tokens: number;
  updatedAtMs: number;
}

/** A take's outcome and the bucket's level after it. */
export type TakeDecision =
  | { ok: true; state: BucketState; remaining: number }
  | { ok: false; state: BucketState; remaining: 0; retryAfterSeconds: number };

// Floating-point slack: 0.1 + 0.2 tokens is a token's worth here, and 3.0000000000000004
// seconds of waiting rounds up to 3, not 4. Far below anything a clock can measure.
const EPSILON = 1e-9;

/** Throws on a rule no bucket can honour (a contract bug, not a denial). */
export function assertRule(rule: BucketRule): void {
  if (!(Number.isFinite(rule.capacity) && rule.capacity >= 1))
    throw new RangeError(`capacity must be ≥ 1, got ${rule.capacity}`);
  if (!(Number.isFinite(rule.refillPerSecond) && rule.refillPerSecond > 0)) {
    throw new RangeError(`refillPerSecond must be > 0, got ${rule.refillPerSecond}`);
  }
}

/** A new bucket starts full. */
export function fullBucket(rule: BucketRule, nowMs: number): BucketState {
  return { tokens: rule.capacity, updatedAtMs: nowMs };
}

/**
 * The level at `nowMs`: refilled for the time elapsed, capped at capacity. A clock that reads
 * earlier than the last update (another replica's, slightly ahead) refills nothing; time never
 * runs backwards for a bucket.
 */
export function refill(state: BucketState, rule: BucketRule, nowMs: number): BucketState {
  const elapsedMs = Math.max(0, nowMs - state.updatedAtMs);
  return {
    tokens: Math.min(rule.capacity, state.tokens + (rule.refillPerSecond * elapsedMs) / 1000),
    updatedAtMs: Math.max(state.updatedAtMs, nowMs),
  };
}

/** Seconds until a refilled bucket holds one token, rounded up: the exact `Retry-After`. */
export function secondsUntilToken(state: BucketState, rule: BucketRule): number {
  const missing = 1 - state.tokens;
  if (missing <= EPSILON) return 0;
  return Math.max(1, Math.ceil(missing / rule.refillPerSecond - EPSILON));
}

/** Takes one token at `nowMs` if there is one. */
export function take(state: BucketState, rule: BucketRule, nowMs: number): TakeDecision {
  const current = refill(state, rule, nowMs);
  if (current.tokens + EPSILON >= 1) {
    const next = { tokens: Math.max(0, current.tokens - 1), updatedAtMs: current.updatedAtMs };
    return { ok: true, state: next, remaining: Math.floor(next.tokens + EPSILON) };
  }
  return { ok: false, state: current, remaining: 0, retryAfterSeconds: secondsUntilToken(current, rule) };
}
