import type { Kysely } from 'kysely';
import { Counter, type Registry } from 'prom-client';
import { Failed, GroupCommit, retryOnConflict } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import {
  bucketId,
  lockBuckets,
  readBucket,
  returnTokens,
  storeBucketIf,
  storeBuckets,
  type BucketAt,
  type BucketKey,
} from './rate-bucket-repository.js';
import { CLOSE_STEP_WAIT_MS, waitAtMost } from '../db/wait-at-most.js';
import {
  assertRule,
  fullBucket,
  refill,
  secondsUntilToken,
  take,
  type BucketRule,
  type BucketState,
} from './token-bucket.js';
import type { Database } from '../db/database.js';

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
  { ok: true; remaining: number } | { ok: false; code: 'rate_limited'; retryAfterSeconds: number };

/** What the composition root gives the limiter. */
export interface RateLimiterOptions {
  now: () => Date;
  registry: Registry;
}

/**
 * Token buckets per (tenant, agent, tool), exact across replicas: compare-and-set takes in group
 * commits, with small leases from generous buckets. Why and the bounds: docs/design/rate-limit-buckets.md.
 * A database fault throws (the pipeline answers 503 and admits nothing).
 */
export class RateLimiter {
  private readonly batches: GroupCommit<TakeRequest, RateDecision>;
  private readonly denials: Counter<'tool_id'>;
  private readonly leasedTakes: Counter<'tool_id'>;
  private readonly conflicts: Counter;
  /** The level this replica last read or stored, per bucket: a guess that the store checks. */
  private readonly known = new Map<string, BucketState>();
  /** Tokens this replica took from a bucket ahead of its takes, and until when it may spend them. */
  private readonly leases = new Map<string, Lease>();

  /** Takes are made durable by the call's intent record, committed synchronously after them. */
  private readonly db: Kysely<DB>;

  constructor(
    database: Database,
    private readonly options: RateLimiterOptions,
  ) {
    this.db = database.hotDeferred;
    this.batches = new GroupCommit((requests) => this.commit(requests));
    this.denials = new Counter({
      name: 'toolgate_rate_limit_denials_total',
      help: 'Calls refused by a rate limit (429 rate_limited), by tool',
      labelNames: ['tool_id'],
      registers: [options.registry],
    });
    this.leasedTakes = new Counter({
      name: 'toolgate_rate_limit_leased_takes_total',
      help: "Calls admitted from this replica's lease on a generous bucket, without a statement, by tool",
      labelNames: ['tool_id'],
      registers: [options.registry],
    });
    this.conflicts = new Counter({
      name: 'toolgate_rate_limit_write_conflicts_total',
      help: 'Bucket compare-and-sets that found the level moved by another replica (decided again from the level as it stands)',
      registers: [options.registry],
    });
  }

  /** Takes one token from the caller's bucket for this tool, or says how long to wait. */
  async take(request: TakeRequest): Promise<RateDecision> {
    assertRule(request);
    const leased = this.spendLease(bucketId(request), request, this.options.now().getTime());
    if (leased) {
      this.leasedTakes.inc({ tool_id: request.toolId });
      return leased;
    }
    const decision = await this.batches.submit(request);
    if (!decision.ok) this.denials.inc({ tool_id: request.toolId });
    return decision;
  }

  /**
   * Gives back a token `take` admitted for a call that was then not made (its run's claim did not stand). It joins this
   * replica's lease on the bucket, which goes back to the bucket with its next write if unspent.
   */
  giveBack(request: TakeRequest): void {
    const id = bucketId(request);
    const nowMs = this.options.now().getTime();
    const lease = this.leases.get(id);
    if (lease && lease.capacity === request.capacity && lease.refillPerSecond === request.refillPerSecond) {
      lease.tokens += 1;
      lease.untilMs = Math.max(lease.untilMs, nowMs + LEASE_WINDOW_MS);
      return;
    }
    if (lease) return; // a lease under another rule: the token is lost, the strict side
    this.leases.set(id, {
      key: { tenantId: request.tenantId, agentId: request.agentId, toolId: request.toolId },
      tokens: 1,
      untilMs: nowMs + LEASE_WINDOW_MS,
      capacity: request.capacity,
      refillPerSecond: request.refillPerSecond,
    });
  }

  /**
   * A refusal this replica decides from the bucket's level as it last stored or read it, without a statement (it holds
   * no lease there), with that level: the caller's statement confirms the bucket still holds it (`bucketStillAt`).
   * Undefined when it knows no level, or that level would admit the take. Counted as a denial once its record stands
   * (`refusalStood`).
   */
  refusalFromKnown(
    request: TakeRequest,
  ): { decision: Extract<RateDecision, { ok: false }>; level: BucketAt } | undefined {
    assertRule(request);
    const id = bucketId(request);
    const known = this.known.get(id);
    if (!known || this.leases.has(id)) return undefined;
    const decision = take(known, request, this.options.now().getTime());
    if (decision.ok) return undefined;
    return {
      decision: { ok: false, code: 'rate_limited', retryAfterSeconds: decision.retryAfterSeconds },
      level: { tenantId: request.tenantId, agentId: request.agentId, toolId: request.toolId, ...known },
    };
  }

  /** A refusal `refusalFromKnown` decided was confirmed by its record: a denial, counted once. */
  refusalStood(level: BucketAt): void {
    this.denials.inc({ tool_id: level.toolId });
  }

  /** What `take` would answer now, consuming nothing (for dry runs). */
  async peek(request: TakeRequest): Promise<RateDecision> {
    assertRule(request);
    const nowMs = this.options.now().getTime();
    const lease = this.liveLease(bucketId(request), request, nowMs);
    if (lease) return { ok: true, remaining: Math.floor(lease.tokens - 1) };
    const stored = await readBucket(this.db, request);
    const current = stored ? refill(stored, request, nowMs) : fullBucket(request, nowMs);
    const wait = secondsUntilToken(current, request);
    return wait === 0
      ? { ok: true, remaining: Math.floor(current.tokens + 1e-9) }
      : { ok: false, code: 'rate_limited', retryAfterSeconds: wait };
  }

  /**
   * Waits for takes in flight, then gives unspent leased tokens back for other replicas. Best-effort: unanswered within
   * `CLOSE_STEP_WAIT_MS` they are lost, the strict side (docs/design/rate-limit-buckets.md).
   */
  async close(): Promise<void> {
    await this.batches.drain();
    const unspent = [...this.leases.values()].filter((lease) => lease.tokens > 0);
    // Out of the map first: nothing spends or returns them twice.
    this.leases.clear();
    if (unspent.length === 0) return;
    await waitAtMost(
      returnTokens(
        this.db,
        unspent.map((lease) => ({ key: lease.key, tokens: lease.tokens, capacity: lease.capacity })),
        CLOSE_STEP_WAIT_MS,
      ),
    );
  }

  /** One batch: each bucket's takes decided in arrival order, bucket by bucket (they are independent). */
  private async commit(requests: TakeRequest[]): Promise<Array<RateDecision | Failed>> {
    const nowMs = this.options.now().getTime();
    // Positions, not requests, identify the takes: one request object may be submitted twice.
    const byBucket = new Map<string, number[]>();
    requests.forEach((request, position) => {
      const id = bucketId(request);
      const list = byBucket.get(id);
      if (list) list.push(position);
      else byBucket.set(id, [position]);
    });
    const decided: Array<RateDecision | Failed> = new Array(requests.length);
    const failures: unknown[] = [];
    await Promise.all(
      [...byBucket].map(async ([id, positions]) => {
        try {
          const decisions = await this.commitBucket(
            id,
            positions.map((position) => requests[position]!),
            nowMs,
          );
          positions.forEach((position, i) => (decided[position] = decisions[i]!));
        } catch (error) {
          // Buckets are stored independently: one bucket's fault fails only its takes.
          failures.push(error);
          for (const position of positions) decided[position] = new Failed(error);
        }
      }),
    );
    // Nothing was stored: let the batch fail as a whole.
    if (failures.length === byBucket.size) throw failures[0];
    return decided;
  }

  /**
   * One bucket's takes, decided on the level this replica knows and stored if it still stands; else decided again from
   * the level answered, under the row lock once they keep losing (docs/design/rate-limit-buckets.md).
   */
  private async commitBucket(id: string, takes: TakeRequest[], nowMs: number): Promise<RateDecision[]> {
    const key = takes[0]!;
    // What the last lease left unspent goes back with this batch (or is lost, if it fails: the
    // strict side). Taken out of the map first, so nothing spends it meanwhile.
    const unspent = this.leases.get(id)?.tokens ?? 0;
    this.leases.delete(id);
    let before = this.known.get(id);
    for (let attempt = 0; attempt < STORE_ATTEMPTS; attempt += 1) {
      before ??= await this.readLevel(key, nowMs);
      const { decisions, after, lease } = decideTakes(before, takes, nowMs, unspent);
      const stored = await storeBucketIf(this.db, key, before, after);
      if (stored.ok) {
        this.remember(id, after, lease, key, nowMs);
        return decisions;
      }
      this.conflicts.inc();
      this.known.delete(id);
      before = stored.current;
    }
    const decisions = await retryOnConflict(() =>
      this.db.transaction().execute(async (trx) => {
        const states = await lockBuckets(trx, [{ key, initial: fullBucket(key, nowMs) }]);
        const { decisions: locked, after, lease } = decideTakes(states.get(id)!, takes, nowMs, unspent);
        await storeBuckets(trx, [{ key, state: after }]);
        return { locked, after, lease };
      }),
    );
    this.remember(id, decisions.after, decisions.lease, key, nowMs);
    return decisions.locked;
  }

  /** The bucket's stored level, creating it full if it was never used. */
  private async readLevel(key: TakeRequest, nowMs: number): Promise<BucketState> {
    const states = await lockBuckets(this.db, [{ key, initial: fullBucket(key, nowMs) }]);
    return states.get(bucketId(key))!;
  }

  private remember(id: string, state: BucketState, lease: number, rule: TakeRequest, nowMs: number): void {
    // A guess per bucket is small, but buckets are many: forget them all now and then.
    if (this.known.size >= 10_000 && !this.known.has(id)) this.known.clear();
    this.known.set(id, state);
    if (lease > 0) {
      // Dropping leases loses their tokens (the strict side); it takes 10,000 busy buckets.
      if (this.leases.size >= 10_000) this.leases.clear();
      this.leases.set(id, {
        key: { tenantId: rule.tenantId, agentId: rule.agentId, toolId: rule.toolId },
        tokens: lease,
        untilMs: nowMs + LEASE_WINDOW_MS,
        capacity: rule.capacity,
        refillPerSecond: rule.refillPerSecond,
      });
    }
  }

  /** The bucket's lease, if this replica holds one it may still spend on this rule now. */
  private liveLease(id: string, rule: BucketRule, nowMs: number): Lease | undefined {
    const lease = this.leases.get(id);
    if (!lease || lease.tokens < 1 || nowMs >= lease.untilMs) return undefined;
    // A contract changed since: its takes go through the bucket (which gets the lease back).
    if (lease.capacity !== rule.capacity || lease.refillPerSecond !== rule.refillPerSecond) return undefined;
    return lease;
  }

  /** Admits a take from this replica's lease on its bucket, if it holds a live one. */
  private spendLease(id: string, rule: BucketRule, nowMs: number): RateDecision | undefined {
    const lease = this.liveLease(id, rule, nowMs);
    if (!lease) return undefined;
    lease.tokens -= 1;
    return { ok: true, remaining: Math.floor(lease.tokens) };
  }
}

/** A replica's tokens taken ahead from a bucket, under the rule they were taken for. */
interface Lease extends BucketRule {
  key: BucketKey;
  tokens: number;
  untilMs: number;
}

/** How long a lease may be spent: also what it holds at most, in refill. */
export const LEASE_WINDOW_MS = 100;

/** The lease a batch may take from a bucket with this rule: none under two tokens. */
export function leaseSize(rule: BucketRule): number {
  const size = Math.floor(Math.min(rule.capacity / 8, (rule.refillPerSecond * LEASE_WINDOW_MS) / 1000));
  return size >= 2 ? size : 0;
}

/** How many compare-and-set writes a bucket's batch tries before it is decided under the row lock. */
const STORE_ATTEMPTS = 4;

/**
 * Takes decided in arrival order from one bucket's level, with `unspent` leased tokens given
 * back first; the level they leave it at, less the lease taken when every take was admitted and
 * the bucket stays at least half full after it.
 */
function decideTakes(
  level: BucketState,
  takes: TakeRequest[],
  nowMs: number,
  unspent = 0,
): { decisions: RateDecision[]; after: BucketState; lease: number } {
  let state = level;
  if (unspent > 0) {
    const current = refill(level, takes[0]!, nowMs);
    state = { tokens: Math.min(takes[0]!.capacity, current.tokens + unspent), updatedAtMs: current.updatedAtMs };
  }
  const decisions = takes.map((request): RateDecision => {
    const rule: BucketRule = request;
    const decision = take(state, rule, nowMs);
    state = decision.state;
    if (decision.ok) return { ok: true, remaining: decision.remaining };
    return { ok: false, code: 'rate_limited', retryAfterSeconds: decision.retryAfterSeconds };
  });
  const rule = takes[takes.length - 1]!;
  const lease = leaseSize(rule);
  if (lease > 0 && decisions.every((d) => d.ok) && state.tokens - lease >= rule.capacity / 2) {
    return { decisions, after: { tokens: state.tokens - lease, updatedAtMs: state.updatedAtMs }, lease };
  }
  return { decisions, after: state, lease: 0 };
}
