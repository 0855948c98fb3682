import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { budgetApplies, type Budget, type ChargeSubject } from '../src/budgets/budget.js';
import { BUDGET_PERIODS } from '../src/budgets/budget-period.js';
import { insertBudget } from '../src/budgets/budget-repository.js';
import { findBudgetsFor, liveBudgetsOf } from '../src/budgets/budget-counter-repository.js';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';

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
