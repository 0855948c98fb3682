import { sql } from 'kysely';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db/database.js';
import { RateLimiter, type RateDecision, type TakeRequest } from '../src/rate-limits/rate-limiter.js';
import { storeBucketIf, type BucketKey } from '../src/rate-limits/rate-bucket-repository.js';
import type { BucketState } from '../src/rate-limits/token-bucket.js';
import { createTestDatabase, hasPostgresServer, openPool, type TestDatabase } from './helpers/database.js';
import { lockWaits, until } from './helpers/waits.js';
import { ManualClock } from './helpers/manual-clock.js';

// A limiter remembers the level it last stored per bucket and stores the next one only if the
// bucket still holds it (compare and set). Its memory is a guess: whatever else changed the
// bucket must win, and every take must get the decision of its own place in line.
let testDb: TestDatabase;
// The clock stands still unless a test moves it: refill is then exactly 0.
const clock = new ManualClock('2030-02-20T15:00:00.000Z');
let seq = 0;

beforeAll(async () => {
  testDb = await createTestDatabase();
});
afterAll(async () => {
  await testDb.drop();
});

function bucket(capacity: number, refillPerSecond: number): TakeRequest {
  seq += 1;
  return { tenantId: `rlc-t${seq}`, agentId: 'agent.one', toolId: 'web.fetch', capacity, refillPerSecond };
}

async function conflicts(registry: Registry): Promise<number> {
  return (await registry.getSingleMetric('toolgate_rate_limit_write_conflicts_total')!.get()).values[0]?.value ?? 0;
}

const ok = (remaining: number): RateDecision => ({ ok: true, remaining });
const refused = (retryAfterSeconds: number): RateDecision => ({ ok: false, code: 'rate_limited', retryAfterSeconds });

const readBucketState = async (key: BucketKey): Promise<BucketState[]> =>
  (
    await sql<{
      tokens: number;
      updated_at: Date;
    }>`select tokens, updated_at from rate_buckets where tenant_id = ${key.tenantId} and agent_id = ${key.agentId} and tool_id = ${key.toolId}`.execute(
      testDb.database.control,
    )
  ).rows.map((row) => ({ tokens: Number(row.tokens), updatedAtMs: new Date(row.updated_at).getTime() }));

const setTokens = (b: TakeRequest, tokens: number) =>
  sql`update rate_buckets set tokens = ${tokens} where tenant_id = ${b.tenantId} and agent_id = ${b.agentId} and tool_id = ${b.toolId}`.execute(
    testDb.database.control,
  );

describe('one request object taken several times in one batch', () => {
  let limiter: RateLimiter;
  beforeAll(() => {
    limiter = new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() });
  });
  afterAll(async () => {
    await limiter.close();
  });

  it('gives each take the decision of its place in line', async () => {
    const b = bucket(3, 0.01);
    const decisions = await Promise.all(Array.from({ length: 5 }, () => limiter.take(b)));
    expect(decisions).toEqual([ok(2), ok(1), ok(0), refused(100), refused(100)]);
  });

  it('keeps the places of takes on two buckets interleaved in one batch', async () => {
    const b = bucket(2, 0.5);
    const c = bucket(1, 0.25);
    const decisions = await Promise.all([b, c, b, c, b, b, c].map((request) => limiter.take(request)));
    expect(decisions).toEqual([ok(1), ok(0), ok(0), refused(4), refused(2), refused(2), refused(4)]);
    // Both buckets are stored empty: the next batch starts from there.
    expect(await Promise.all([limiter.take(b), limiter.take(c)])).toEqual([refused(2), refused(4)]);
  });
});

describe('a bucket changed behind the limiter’s back', () => {
  let limiter: RateLimiter;
  let registry: Registry;
  beforeAll(() => {
    registry = new Registry();
    limiter = new RateLimiter(testDb.database, { now: clock.now, registry });
  });
  afterAll(async () => {
    await limiter.close();
  });

  it('is respected at the next take when it was emptied', async () => {
    const b = bucket(5, 0.5);
    expect(await limiter.take(b)).toEqual(ok(4));
    const before = await conflicts(registry);
    await setTokens(b, 0);
    // The limiter remembers 4 tokens; the bucket holds none. One token at 0.5/s: 2 s.
    expect(await limiter.take(b)).toEqual(refused(2));
    expect(await conflicts(registry)).toBe(before + 1);
    expect(await limiter.take(b)).toEqual(refused(2));
  });

  it('is respected at the next take when it was refilled', async () => {
    const b = bucket(5, 0.5);
    for (const remaining of [4, 3, 2, 1, 0]) expect(await limiter.take(b)).toEqual(ok(remaining));
    expect(await limiter.take(b)).toEqual(refused(2));
    await setTokens(b, 5);
    expect(await Promise.all(Array.from({ length: 6 }, () => limiter.take(b)))).toEqual([
      ok(4),
      ok(3),
      ok(2),
      ok(1),
      ok(0),
      refused(2),
    ]);
  });
});

describe.skipIf(!hasPostgresServer)(
  'a store that waited for the bucket while another replica stored (needs a PostgreSQL server)',
  () => {
    it('answers the level the other stored, which the next store is decided from', async () => {
      const b = bucket(5, 0.5);
      const limiter = new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() });
      const watcher = new pg.Client({ connectionString: testDb.url });
      await watcher.connect();
      const other = new pg.Client({ connectionString: testDb.url });
      await other.connect();
      try {
        expect(await limiter.take(b)).toEqual(ok(4));
        const key = { tenantId: b.tenantId, agentId: b.agentId, toolId: b.toolId };
        const [stale] = await readBucketState(key);
        // Another replica holds the row, uncommitted, having taken three tokens.
        await other.query('begin');
        await other.query(
          'update rate_buckets set tokens = 1 where tenant_id = $1 and agent_id = $2 and tool_id = $3',
          [b.tenantId, b.agentId, b.toolId],
        );
        const store = storeBucketIf(testDb.database.control, key, stale!, {
          tokens: 3,
          updatedAtMs: stale!.updatedAtMs,
        });
        await until('the store to wait for the bucket', async () => (await lockWaits(watcher)) > 0);
        await other.query('commit');
        // Read as it stood when the statement began, the level would still be 4.
        expect(await store).toEqual({ ok: false, current: { tokens: 1, updatedAtMs: stale!.updatedAtMs } });
        expect((await readBucketState(key))[0]).toEqual({ tokens: 1, updatedAtMs: stale!.updatedAtMs });
      } finally {
        await other.query('rollback').catch(() => undefined);
        await other.end();
        await watcher.end();
        await limiter.close();
      }
    });
  },
);

describe.skipIf(!hasPostgresServer)('two replicas taking turns on one bucket (needs a PostgreSQL server)', () => {
  let databases: Database[];

  beforeAll(async () => {
    databases = await Promise.all([0, 1].map(() => openPool(testDb.url, 3)));
  });
  afterAll(async () => {
    await Promise.all(databases.map((d) => d.close()));
  });

  it('admit exactly the capacity, each take deciding on what the other stored, and count the lost races', async () => {
    const registries = databases.map(() => new Registry());
    const limiters = databases.map((d, i) => new RateLimiter(d, { now: clock.now, registry: registries[i]! }));
    try {
      const b = bucket(5, 0.001);
      const decisions: RateDecision[] = [];
      for (let i = 0; i < 10; i += 1) decisions.push(await limiters[i % 2]!.take(b));
      expect(decisions).toEqual([ok(4), ok(3), ok(2), ok(1), ok(0), ...Array.from({ length: 5 }, () => refused(1000))]);
      // Each replica's memory went stale as soon as the other one took a token.
      const lost = await Promise.all(registries.map(conflicts));
      expect(lost[0]).toBeGreaterThan(0);
      expect(lost[1]).toBeGreaterThan(0);

      // A second later, a thousandth of a token has come back: nothing to admit. After 1000 s,
      // one token: whichever replica asks first gets it, and only one take does.
      clock.advance(1_000);
      expect((await Promise.all(limiters.map((l) => l.take(b)))).filter((d) => d.ok)).toHaveLength(0);
      clock.advance(999_000);
      const afterRefill = await Promise.all([
        limiters[0]!.take(b),
        limiters[1]!.take(b),
        limiters[0]!.take(b),
        limiters[1]!.take(b),
      ]);
      expect(afterRefill.filter((d) => d.ok)).toEqual([ok(0)]);
    } finally {
      await Promise.all(limiters.map((l) => l.close()));
    }
  });

  it('admit exactly the capacity when both take at once, many times over', async () => {
    const registries = databases.map(() => new Registry());
    const limiters = databases.map((d, i) => new RateLimiter(d, { now: clock.now, registry: registries[i]! }));
    try {
      const b = bucket(40, 0.001);
      let admitted = 0;
      for (let round = 0; round < 20; round += 1) {
        const decisions = await Promise.all(Array.from({ length: 6 }, (_, i) => limiters[i % 2]!.take(b)));
        admitted += decisions.filter((d) => d.ok).length;
      }
      expect(admitted).toBe(40);
      const lost = await Promise.all(registries.map(conflicts));
      expect(lost[0]! + lost[1]!).toBeGreaterThan(0);
    } finally {
      await Promise.all(limiters.map((l) => l.close()));
    }
  });
});
