import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { budgetApplies, type Budget, type ChargeSubject } from '../src/budgets/budget.js';
import { BUDGET_PERIODS } from '../src/budgets/budget-period.js';
import { insertBudget } from '../src/budgets/budget-repository.js';
import { findBudgetsFor, liveBudgetsOf } from '../src/budgets/budget-counter-repository.js';
import { Registry } from 'prom-client';
import { bucketStillAt } from '../src/rate-limits/rate-bucket-repository.js';
import { RateLimiter } from '../src/rate-limits/rate-limiter.js';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';
import { ManualClock } from './helpers/manual-clock.js';

/*
 * A rule written twice, in TypeScript and in SQL, must decide alike: each case here draws many worlds at
 * random (seeded, so a failure repeats) and asks every form of the rule the same questions.
 */

/** A small seeded generator (mulberry32): the same worlds on every run. */
function random(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

let testDb: TestDatabase;
beforeAll(async () => {
  testDb = await createTestDatabase();
});
afterAll(async () => {
  await testDb?.drop();
});

describe('which budgets apply to a call: budgetApplies, findBudgetsFor and liveBudgetsOf agree', () => {
  // Ids that look alike (a prefix, a LIKE wildcard, a case) so that a rule matching loosely shows.
  const tenants = ['t', 't1', 'T1', 't_'];
  const agents = ['a', 'a1', 'a%', 'A1'];
  const runs = ['r', 'r1', 'r_1', 'R1'];

  it('for every subject of 12 random worlds of live, removed and replaced budgets', async () => {
    const db = testDb.database.control;
    const next = random(41);
    const pick = <T>(values: readonly T[]): T => values[Math.floor(next() * values.length)]!;
    for (let world = 0; world < 12; world += 1) {
      await sql`truncate budgets cascade`.execute(db);
      const budgets: Budget[] = [];
      const at = new Date('2026-12-01T00:00:00Z');
      for (let i = 0; i < 40; i += 1) {
        const scope = pick(['tenant', 'agent', 'run'] as const);
        const budget: Budget = {
          id: `bud_${world}_${i}`,
          tenant_id: pick(tenants),
          scope,
          agent_id: scope === 'agent' ? pick(agents) : null,
          run_id: scope === 'run' ? pick(runs) : null,
          period: pick(BUDGET_PERIODS),
          limit_units: 10,
          warn_ratio: 1,
          grace_units: 0,
          created_at: at,
          created_by: 'test',
          updated_at: at,
          updated_by: 'test',
          removed_at: next() < 0.3 ? at : null,
          removed_by: null,
        };
        // One live budget per subject and period: a second live one is skipped, as the API refuses it.
        const inserted = await db
          .transaction()
          .execute((trx) => insertBudget(trx, budget))
          .catch(() => undefined);
        if (inserted !== undefined) budgets.push(inserted);
      }
      const subjects: ChargeSubject[] = tenants.flatMap((tenantId) =>
        agents.flatMap((agentId) => runs.map((runId) => ({ tenantId, agentId, runId }))),
      );
      const found = await findBudgetsFor(db, subjects);
      const { rows } = await sql<{ t: string; a: string; r: string; id: string }>`
        select s.t, s.a, s.r, b.id from ${liveBudgetsOf(subjects)}`.execute(db);
      for (const subject of subjects) {
        const byRule = budgets.filter((b) => budgetApplies(b, subject)).map((b) => b.id);
        const byFind = found.filter((b) => budgetApplies(b, subject)).map((b) => b.id);
        const bySql = rows
          .filter((row) => row.t === subject.tenantId && row.a === subject.agentId && row.r === subject.runId)
          .map((row) => row.id);
        const label = `world ${world}, ${JSON.stringify(subject)}`;
        expect(byFind.sort(), label).toEqual([...byRule].sort());
        expect(bySql.sort(), label).toEqual([...byRule].sort());
      }
    }
  });
});

describe("a refusal from a bucket's known level: refusalFromKnown and bucketStillAt agree on that level", () => {
  it('for every refusal of random takes under random rules and clocks, and not once the bucket moved', async () => {
    const db = testDb.database.control;
    const next = random(43);
    const clock = new ManualClock(new Date('2026-12-07T10:00:00.000Z'));
    const limiter = new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() });
    const other = new RateLimiter(testDb.database, { now: clock.now, registry: new Registry() });
    const stillAt = async (level: {
      tenantId: string;
      agentId: string;
      toolId: string;
      tokens: number;
      updatedAtMs: number;
    }) =>
      (
        await sql<{ ok: boolean }>`select ${bucketStillAt(
          sql`${level.tenantId}::text`,
          sql`${level.agentId}::text`,
          sql`${level.toolId}::text`,
          sql`${level.tokens}::float8`,
          sql`${new Date(level.updatedAtMs).toISOString()}::timestamptz`,
        )} as ok`.execute(db)
      ).rows[0]!.ok;
    let refusals = 0;
    for (let bucket = 0; bucket < 20; bucket += 1) {
      // Rules whose refill is no round number of tokens per millisecond, so levels are fractions.
      const rule = { capacity: 1 + Math.floor(next() * 4), refillPerSecond: [0.1, 0.3, 1 / 3, 2.5, 7][bucket % 5]! };
      const request = { tenantId: 't', agentId: `a${bucket}`, toolId: 'tool', ...rule };
      for (let i = 0; i < 12; i += 1) {
        clock.advance(Math.floor(next() * 700));
        await limiter.take(request);
        const known = limiter.refusalFromKnown(request);
        if (known === undefined) continue;
        refusals += 1;
        expect(await stillAt(known.level), JSON.stringify(known.level)).toBe(true);
        if (next() < 0.3) {
          // Another replica's take moves the bucket (once it holds a token again): the level no longer stands.
          clock.advance(Math.ceil(1000 / rule.refillPerSecond));
          expect((await other.take(request)).ok).toBe(true);
          expect(await stillAt(known.level)).toBe(false);
        }
      }
    }
    expect(refusals).toBeGreaterThan(20);
  });
});
