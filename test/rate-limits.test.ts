import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db/database.js';
import { isDatabaseUnavailable } from '../src/db/unavailable.js';
import { readBucket } from '../src/rate-limits/rate-bucket-repository.js';
import {
  LEASE_WINDOW_MS,
  leaseSize,
  RateLimiter,
  type RateDecision,
  type TakeRequest,
} from '../src/rate-limits/rate-limiter.js';
import { createTestDatabase, hasPostgresServer, openPool, type TestDatabase } from './helpers/database.js';
import { ManualClock } from './helpers/manual-clock.js';
import { TcpProxy } from './helpers/tcp-proxy.js';

// app.services.rateLimiter: token buckets per (tenant, agent, tool), shared by every replica.
let testDb: TestDatabase;
let limiter: RateLimiter;
let registry: Registry;
const clock = new ManualClock('2030-01-15T12:00:00.000Z');
let seq = 0;

beforeAll(async () => {
  testDb = await createTestDatabase();
  registry = new Registry();
  limiter = new RateLimiter(testDb.database, { now: clock.now, registry });
});
afterAll(async () => {
  await limiter.close();
  await testDb.drop();
});

/** A bucket of its own for each test. */
function bucket(capacity: number, refillPerSecond: number): TakeRequest {
  seq += 1;
  return { tenantId: `rl-t${seq}`, agentId: 'agent.one', toolId: 'web.fetch', capacity, refillPerSecond };
}

const admittedCount = (decisions: RateDecision[]) => decisions.filter((d) => d.ok).length;

/** A per-tool counter of the limiter's registry, for the tool every test bucket names. */
const countOf = async (name: string) =>
  (await registry.getSingleMetric(name)!.get()).values.find((v) => v.labels.tool_id === 'web.fetch')?.value ?? 0;

describe('take', () => {
  it('admits a full bucket’s capacity, then refuses with the exact Retry-After', async () => {
    const b = bucket(3, 0.25);
    const decisions: RateDecision[] = [];
    for (let i = 0; i < 5; i += 1) decisions.push(await limiter.take(b));
    expect(decisions).toEqual([
      { ok: true, remaining: 2 },
      { ok: true, remaining: 1 },
      { ok: true, remaining: 0 },
      // One token at 0.25 per second: 4 seconds.
      { ok: false, code: 'rate_limited', retryAfterSeconds: 4 },
      { ok: false, code: 'rate_limited', retryAfterSeconds: 4 },
    ]);
  });

  it('admits again exactly when Retry-After has passed, and counts down meanwhile', async () => {
    const b = bucket(1, 0.5);
    expect((await limiter.take(b)).ok).toBe(true);
    expect(await limiter.take(b)).toMatchObject({ ok: false, retryAfterSeconds: 2 });
    clock.advance(1_500);
    expect(await limiter.take(b)).toMatchObject({ ok: false, retryAfterSeconds: 1 });
    clock.advance(499);
    expect(await limiter.take(b)).toMatchObject({ ok: false, retryAfterSeconds: 1 });
    clock.advance(1);
    expect(await limiter.take(b)).toEqual({ ok: true, remaining: 0 });
  });

  it('refills at the contract’s rate but never past its capacity', async () => {
    const b = bucket(4, 2);
    for (let i = 0; i < 4; i += 1) await limiter.take(b);
    clock.advance(1_000);
    const afterOneSecond = await Promise.all(Array.from({ length: 5 }, () => limiter.take(b)));
    expect(admittedCount(afterOneSecond)).toBe(2);
    clock.advance(3_600_000);
    const afterAnHour = await Promise.all(Array.from({ length: 10 }, () => limiter.take(b)));
    expect(admittedCount(afterAnHour)).toBe(4);
  });

  it('keeps one bucket per tenant, agent and tool', async () => {
    const b = bucket(1, 0.01);
    expect((await limiter.take(b)).ok).toBe(true);
    expect((await limiter.take(b)).ok).toBe(false);
    expect((await limiter.take({ ...b, agentId: 'agent.two' })).ok).toBe(true);
    expect((await limiter.take({ ...b, toolId: 'web.search' })).ok).toBe(true);
    expect((await limiter.take({ ...b, tenantId: `${b.tenantId}-other` })).ok).toBe(true);
  });

  it('follows a contract whose capacity shrinks', async () => {
    const b = bucket(10, 0.01);
    expect((await limiter.take(b)).ok).toBe(true);
    // 9 tokens left, but the new contract holds at most 2.
    const shrunk = { ...b, capacity: 2 };
    const decisions = await Promise.all(Array.from({ length: 4 }, () => limiter.take(shrunk)));
    expect(admittedCount(decisions)).toBe(2);
  });

  it('spends a generous bucket’s lease without a statement, and gives back what it did not spend', async () => {
    // An eighth of the capacity is 125, 100 ms of refill is 10: a lease of 10 tokens.
    const b = bucket(1000, 100);
    expect(leaseSize(b)).toBe(10);
    const stored = async () => (await readBucket(testDb.database.control, b))!.tokens;
    const leasedTakes = () => countOf('toolgate_rate_limit_leased_takes_total');
    const leasedBefore = await leasedTakes();
    expect((await limiter.take(b)).ok).toBe(true);
    // The first take stored its own token and the lease's ten.
    expect(await stored()).toBe(989);
    expect(await limiter.peek(b)).toMatchObject({ ok: true });
    for (let i = 0; i < 10; i += 1) expect((await limiter.take(b)).ok).toBe(true);
    // Spent from the lease: the stored level did not move, and the metric counted them.
    expect(await stored()).toBe(989);
    expect(await leasedTakes()).toBe(leasedBefore + 10);
    // The lease is spent: the next take goes to the bucket, and leases again.
    expect((await limiter.take(b)).ok).toBe(true);
    expect(await stored()).toBe(978);
    for (let i = 0; i < 3; i += 1) expect((await limiter.take(b)).ok).toBe(true);
    expect(await stored()).toBe(978);
    // Past the window the lease is not spent: the 7 tokens left go back with the next take.
    clock.advance(LEASE_WINDOW_MS);
    expect((await limiter.take(b)).ok).toBe(true);
    // 978 + 10 refilled + 7 given back − 1 taken − 10 leased again.
    expect(await stored()).toBe(984);
  });

  it('takes no lease from a bucket it would leave less than half full, nor from a small or slow one', async () => {
    const b = bucket(32, 20); // a lease of 2
    expect(leaseSize(b)).toBe(2);
    expect(leaseSize(bucket(10, 40))).toBe(0);
    expect(leaseSize(bucket(1000, 10))).toBe(0);
    const stored = async () => (await readBucket(testDb.database.control, b))!.tokens;
    // Each batch of one take leases 2 while it leaves at least 16: 32 → 29, 26, 23, 20, 17.
    const levels: number[] = [];
    for (let i = 0; i < 15; i += 1) {
      expect((await limiter.take(b)).ok).toBe(true);
      levels.push(await stored());
    }
    expect(levels).toEqual([29, 29, 29, 26, 26, 26, 23, 23, 23, 20, 20, 20, 17, 17, 17]);
    // From here a lease would leave under 16: each take is stored on its own.
    for (const level of [16, 15, 14]) {
      expect((await limiter.take(b)).ok).toBe(true);
      expect(await stored()).toBe(level);
    }
  });

  it('does not spend a lease on a changed contract, and gives it back to the bucket under the new one', async () => {
    const b = bucket(1000, 100);
    expect((await limiter.take(b)).ok).toBe(true);
    const stored = async () => (await readBucket(testDb.database.control, b))!.tokens;
    expect(await stored()).toBe(989);
    // The contract now holds at most 16: the 10 leased go back, capped at 16; one is taken, and a
    // lease of 2 (an eighth of 16) leaves 13.
    expect((await limiter.take({ ...b, capacity: 16 })).ok).toBe(true);
    expect(await stored()).toBe(13);
  });

  it('gives back at a graceful close what it leased and did not spend, for another replica to take, never past capacity', async () => {
    // A lease of 2; the clock stands still, so nothing refills unless it is moved.
    const b = bucket(32, 20);
    const stored = async () => (await readBucket(testDb.database.control, b))!.tokens;
    const closing = new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() });
    const other = new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() });
    try {
      // One taken and two leased (32 → 29); one of the two spent.
      expect((await closing.take(b)).ok).toBe(true);
      expect((await closing.take(b)).ok).toBe(true);
      expect(await stored()).toBe(29);
      // The other replica takes everything the bucket holds.
      let taken = 0;
      while ((await other.take(b)).ok) taken += 1;
      expect(taken).toBe(29);
      await closing.close();
      expect(await stored()).toBe(1);
      expect((await other.take(b)).ok).toBe(true);
      expect((await other.take(b)).ok).toBe(false);
    } finally {
      await Promise.all([closing.close(), other.close()]);
    }

    // Two replicas' leases given back into a bucket that refilled meanwhile: capped at its capacity.
    const c = bucket(32, 20);
    const [first, second] = [0, 1].map(
      () => new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() }),
    );
    expect((await first!.take(c)).ok).toBe(true); // 32 → 29, 2 leased
    clock.advance(10_000);
    expect((await second!.take(c)).ok).toBe(true); // refilled to 32 → 29, 2 leased
    await first!.close();
    expect(await readBucket(testDb.database.control, c)).toMatchObject({ tokens: 31 });
    await second!.close();
    expect(await readBucket(testDb.database.control, c)).toMatchObject({ tokens: 32 });
  });

  it('counts refusals in the metrics', async () => {
    const b = bucket(1, 0.01);
    const count = () => countOf('toolgate_rate_limit_denials_total');
    const before = await count();
    await Promise.all(Array.from({ length: 4 }, () => limiter.take(b)));
    expect(await count()).toBe(before + 3);
  });

  it('refuses contracts no bucket can honour', async () => {
    await expect(limiter.take(bucket(0, 1))).rejects.toThrow(RangeError);
    await expect(limiter.take(bucket(1, 0))).rejects.toThrow(RangeError);
  });
});

describe('peek', () => {
  it('answers what take would, consuming nothing', async () => {
    const b = bucket(2, 0.5);
    for (let i = 0; i < 5; i += 1) expect(await limiter.peek(b)).toEqual({ ok: true, remaining: 2 });
    await limiter.take(b);
    expect(await limiter.peek(b)).toEqual({ ok: true, remaining: 1 });
    await limiter.take(b);
    const peeked = await limiter.peek(b);
    expect(peeked).toEqual({ ok: false, code: 'rate_limited', retryAfterSeconds: 2 });
    expect(await limiter.take(b)).toEqual(peeked);
    clock.advance(2_000);
    expect(await limiter.peek(b)).toEqual({ ok: true, remaining: 1 });
  });
});

describe.skipIf(!hasPostgresServer)('three gateway instances on one bucket (needs a PostgreSQL server)', () => {
  let databases: Awaited<ReturnType<typeof openDatabase>>[];

  beforeAll(async () => {
    databases = await Promise.all([0, 1, 2].map(() => openPool(testDb.url, 5)));
  });
  afterAll(async () => {
    await Promise.all(databases.map((d) => d.close()));
  });

  const instances = (now: () => Date) => databases.map((d) => new RateLimiter(d, { now, registry: new Registry() }));

  it('admit exactly the tokens there are, and give every refusal the same exact Retry-After', async () => {
    const limiters = instances(clock.now);
    const b = bucket(37, 0.25);
    const burst = () => Promise.all(Array.from({ length: 200 }, (_, i) => limiters[i % 3]!.take(b)));
    const first = await burst();
    expect(admittedCount(first)).toBe(37);
    expect(new Set(first.filter((d) => !d.ok).map((d) => (d.ok ? 0 : d.retryAfterSeconds)))).toEqual(new Set([4]));
    // 10 s at 0.25/s: 2.5 tokens, so exactly 2 calls, and the half token left needs 2 s more.
    clock.advance(10_000);
    const second = await burst();
    expect(admittedCount(second)).toBe(2);
    expect(new Set(second.filter((d) => !d.ok).map((d) => (d.ok ? 0 : d.retryAfterSeconds)))).toEqual(new Set([2]));
    await Promise.all(limiters.map((l) => l.close()));
  });

  /**
   * Twenty callers per instance on the real clock for 1.5 s, each taking again as soon as it is
   * answered: at most `capacity + refill × elapsed` go through, at least the capacity (the bucket
   * started full), the callers outrun it, and every refusal waits the one second a token takes.
   */
  async function outrun(b: TakeRequest): Promise<void> {
    const limiters = instances(() => new Date());
    let admitted = 0;
    let refused = 0;
    const started = performance.now();
    const until = started + 1_500;
    await Promise.all(
      limiters.flatMap((l) =>
        Array.from({ length: 20 }, async () => {
          while (performance.now() < until) {
            const decision = await l.take(b);
            if (decision.ok) admitted += 1;
            else {
              refused += 1;
              expect(decision.retryAfterSeconds).toBe(1);
            }
          }
        }),
      ),
    );
    const elapsedSeconds = (performance.now() - started) / 1000;
    expect(admitted).toBeLessThanOrEqual(Math.floor(b.capacity + b.refillPerSecond * elapsedSeconds));
    expect(admitted).toBeGreaterThanOrEqual(b.capacity);
    expect(refused).toBeGreaterThan(0);
    await Promise.all(limiters.map((l) => l.close()));
  }

  it('admit no more than capacity + refill × elapsed on the real clock', async () => {
    const b = bucket(10, 40);
    expect(leaseSize(b)).toBe(0);
    await outrun(b);
  });

  it('leasing from a generous bucket, admit no more than capacity + refill × elapsed on the real clock', async () => {
    const b = bucket(200, 400); // leases of 25 tokens while the bucket is at least half full
    expect(leaseSize(b)).toBe(25);
    await outrun(b);
  });
});

describe.skipIf(!hasPostgresServer)('a database outage (needs a PostgreSQL server)', () => {
  it('does not hold the pool open after a close that gave up on a lease return blocked by a held row', async () => {
    // The replica's own pools, as the app's: closing them waits for every statement they run.
    const own = await openPool(testDb.url!, 4);
    const b = bucket(32, 20);
    const leasing = new RateLimiter(own, { now: clock.now, registry: new Registry() });
    expect((await leasing.take(b)).ok).toBe(true); // 32 → 29, 2 leased
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let locked!: () => void;
    const isLocked = new Promise<void>((resolve) => (locked = resolve));
    // Another transaction holds the bucket's row for longer than the close waits.
    const holder = testDb.database.control.transaction().execute(async (trx) => {
      await trx.selectFrom('rate_buckets').select('tokens').where('tenant_id', '=', b.tenantId).forUpdate().execute();
      locked();
      await held;
    });
    try {
      await isLocked;
      await leasing.close();
      // The return statement must not outlive the close that stopped waiting for it: the pools
      // close while the row is still held (before, they waited out the 15 s statement timeout).
      await own.close();
    } finally {
      release();
      await holder;
    }
    // The tokens went unreturned, as at a crash: never more than the bucket held.
    expect((await readBucket(testDb.database.control, b))!.tokens).toBe(29);
  }, 10_000);

  it('does not fail a close whose leased tokens cannot go back: they are lost, as at a crash', async () => {
    const server = new URL(testDb.url!);
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    const through = await openDatabase({
      databaseUrl: proxy.urlFor(testDb.url!),
      dataDir: '',
      poolSize: 1,
      logger: pino({ level: 'silent' }),
    });
    try {
      const b = bucket(32, 20);
      const leasing = new RateLimiter(through, { now: clock.now, registry: new Registry() });
      expect((await leasing.take(b)).ok).toBe(true); // 32 → 29, 2 leased
      proxy.cutConnections();
      await expect(leasing.close()).resolves.toBeUndefined();
      expect((await readBucket(testDb.database.control, b))!.tokens).toBe(29);
    } finally {
      await through.close();
      await proxy.close();
    }
  });

  it('fails closed: take and peek throw, nothing is admitted', async () => {
    const unreachable = await openDatabase({
      databaseUrl: 'postgres://postgres@127.0.0.1:1/nowhere',
      dataDir: '',
      poolSize: 1,
      logger: pino({ level: 'silent' }),
    });
    const cut = new RateLimiter(unreachable, { now: clock.now, registry: new Registry() });
    try {
      const attempts = [cut.take(bucket(5, 1)), cut.peek(bucket(5, 1))];
      const errors = await Promise.all(
        attempts.map((attempt) =>
          attempt.then(
            () => 'admitted',
            (e: unknown) => e,
          ),
        ),
      );
      for (const error of errors) expect(isDatabaseUnavailable(error)).toBe(true);
    } finally {
      await cut.close();
      await unreachable.close();
    }
  });
});
