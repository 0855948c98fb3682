import type { Kysely } from 'kysely';
import { Counter, type Registry } from 'prom-client';
import { GroupCommit, retryOnConflict } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import { bucketId, lockBuckets, readBucket, storeBuckets, type BucketKey } from './rate-bucket-repository.js';
import { assertRule, fullBucket, refill, secondsUntilToken, take, type BucketRule, type BucketState } from './token-bucket.js';

/** A call asking for a token: its bucket and the tool contract's `rate_limit`. */
export interface TakeRequest extends BucketKey {
  capacity: number;
  refillPerSecond: number;
}

/**
 * `rate_limited` is back-pressure, not failure: `retryAfterSeconds` is exactly how long until
 * the bucket holds a token again (rounded up), if nobody else takes it first.
 */
export type RateDecision =
  | { ok: true; remaining: number }
  | { ok: false; code: 'rate_limited'; retryAfterSeconds: number };

/** What the composition root gives the limiter. */
export interface RateLimiterOptions {
  now: () => Date;
  registry: Registry;
}

/**
 * Token buckets per (tenant, agent, tool), shared by every replica and exact under
 * concurrency: each take is decided against the bucket's stored level under a row lock, so
 * all replicas together admit at most `capacity + refill × elapsed` calls, and a refusal's
 * `Retry-After` is computed from the true level. Takes arriving together are committed
 * together (group commit). Tokens are deliberately not leased to replicas in chunks: tokens
 * parked in one replica would make another refuse with a `Retry-After` that is not true.
 * A database fault throws (the pipeline answers 503 and admits nothing).
 */
export class RateLimiter {
  private readonly batches: GroupCommit<TakeRequest, RateDecision>;
  private readonly denials: Counter<'tool_id'>;

  constructor(
    private readonly db: Kysely<DB>,
    private readonly options: RateLimiterOptions,
  ) {
    this.batches = new GroupCommit((requests) => retryOnConflict(() => this.commit(requests)));
    this.denials = new Counter({
      name: 'toolgate_rate_limit_denials_total',
      help: 'Calls refused by a rate limit (429 rate_limited), by tool',
      labelNames: ['tool_id'],
      registers: [options.registry],
    });
  }

  /** Takes one token from the caller's bucket for this tool, or says how long to wait. */
  async take(request: TakeRequest): Promise<RateDecision> {
    assertRule(request);
    const decision = await this.batches.submit(request);
    if (!decision.ok) this.denials.inc({ tool_id: request.toolId });
    return decision;
  }

  /** What `take` would answer now, consuming nothing (for dry runs). */
  async peek(request: TakeRequest): Promise<RateDecision> {
    assertRule(request);
    const nowMs = this.options.now().getTime();
    const stored = await readBucket(this.db, request);
    const current = stored ? refill(stored, request, nowMs) : fullBucket(request, nowMs);
    const wait = secondsUntilToken(current, request);
    return wait === 0 ? { ok: true, remaining: Math.floor(current.tokens + 1e-9) } : { ok: false, code: 'rate_limited', retryAfterSeconds: wait };
  }

  /** Waits for takes in flight. */
  async close(): Promise<void> {
    await this.batches.drain();
  }

  /** One batch, one transaction: takes decided in arrival order against the locked buckets. */
  private async commit(requests: TakeRequest[]): Promise<RateDecision[]> {
    const nowMs = this.options.now().getTime();
    return this.db.transaction().execute(async (trx) => {
      const states = await lockBuckets(
        trx,
        requests.map((request) => ({ key: request, initial: fullBucket(request, nowMs) })),
      );
      const changed = new Map<string, { key: BucketKey; state: BucketState }>();
      const decisions = requests.map((request): RateDecision => {
        const id = bucketId(request);
        const rule: BucketRule = request;
        const decision = take(states.get(id)!, rule, nowMs);
        states.set(id, decision.state);
        changed.set(id, { key: request, state: decision.state });
        if (decision.ok) return { ok: true, remaining: decision.remaining };
        return { ok: false, code: 'rate_limited', retryAfterSeconds: decision.retryAfterSeconds };
      });
      await storeBuckets(trx, [...changed.values()]);
      return decisions;
    });
  }
}
