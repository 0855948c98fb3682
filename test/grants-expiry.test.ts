import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database } from '../src/db/database.js';
import { GrantExpirySweeper } from '../src/grants/grant-expiry-sweeper.js';
import { startControlPlaneApp } from './helpers/control-plane.js';
import { createTestDatabase, hasPostgresServer, openPool, type TestDatabase } from './helpers/database.js';
import type { AppClient } from './helpers/harness.js';
import { ManualClock } from './helpers/manual-clock.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';

// Expiry is revocation: each lapse is one `grant.expired` event, even with several replicas.
const T = 'tenant-expiry';
const operator = tokens.tenantOperator(T, 'dora');
const platform = tokens.platform();

describe.skipIf(!hasPostgresServer)(
  'the grant expiry sweeper with two instances running (needs a PostgreSQL server)',
  () => {
    let db: TestDatabase;
    let otherDb: Database;
    let a: AppClient;
    let b: AppClient;
    const clock = new ManualClock(new Date());

    beforeAll(async () => {
      db = await createTestDatabase();
      otherDb = await openPool(db.url, 5);
      a = await startControlPlaneApp(db.database, {}, { now: clock.now });
      b = await startControlPlaneApp(otherDb, {}, { now: clock.now });
    });
    afterAll(async () => {
      await a?.close();
      await b?.close();
      await otherDb?.close();
      await db?.drop();
    });

    async function expiredEvents(): Promise<Array<Record<string, any>>> {
      const res = await a.get('/audit', { token: platform, query: { event_type: 'grant.expired', limit: 500 } });
      return res.body.items;
    }

    it('records each lapse exactly once, seconds late at most, as system.expiry', async () => {
      const expiresAt = new Date(clock.now().getTime() + 60_000);
      const ids: string[] = [];
      for (let i = 0; i < 6; i += 1) {
        const res = await (i % 2 === 0 ? a : b).post('/grants', {
          token: operator,
          body: {
            agent_id: `sweep.agent${i}`,
            tool_id: 'scf.read',
            scope: 'per-session',
            scope_ref: `session-${i}`,
            expires_at: expiresAt.toISOString(),
            rationale: 'short task',
          },
        });
        expect(res.status).toBe(201);
        ids.push(res.body.id);
      }
      // A revoked grant has ended already: its expiry is not recorded again.
      await a.post(`/grants/${ids[5]}/revoke`, { token: operator, body: { reason: 'done early' } });
      const lapsing = ids.slice(0, 5);

      // Besides the two apps' own sweepers, four more race them from both connections pools.
      const racers = [db.database, otherDb, db.database, otherDb].map(
        (database) =>
          new GrantExpirySweeper({
            database,
            now: clock.now,
            intervalMs: 60_000,
            logger: pino({ level: 'silent' }),
          }),
      );
      clock.advance(60_001);
      await until(
        'every lapse to be recorded',
        async () => {
          await Promise.all(racers.map((racer) => racer.sweep()));
          const seen = new Set((await expiredEvents()).map((e) => e.details.grant_id));
          return lapsing.every((id) => seen.has(id));
        },
        { intervalMs: 50 },
      );
      // Later, every sweeper has another go, then count.
      clock.advance(1_500);
      await Promise.all(racers.map((racer) => racer.sweep()));

      const events = await expiredEvents();
      const perGrant = new Map<string, number>();
      for (const e of events) perGrant.set(e.details.grant_id, (perGrant.get(e.details.grant_id) ?? 0) + 1);
      expect(Object.fromEntries(perGrant)).toEqual(Object.fromEntries(lapsing.map((id) => [id, 1])));
      for (const e of events) {
        expect(e).toMatchObject({
          actor: 'system.expiry',
          tenant_id: T,
          tool_id: 'scf.read',
          status: 'expired',
          reason_code: 'grant_expired',
        });
        expect(new Date(e.occurred_at).getTime()).toBeGreaterThanOrEqual(expiresAt.getTime());
        expect(e.details.recorded_late_ms).toBeLessThan(5_000);
      }
      const chain = await a.get('/audit/verify', { token: platform });
      expect(chain.body.ok).toBe(true);
    });
  },
);

describe('the grant expiry sweeper on one instance', () => {
  let db: TestDatabase;
  let client: AppClient;
  const clock = new ManualClock(new Date());
  beforeAll(async () => {
    db = await createTestDatabase();
    client = await startControlPlaneApp(db.database, { TOOLGATE_GRANT_EXPIRY_SWEEP_MS: '100' }, { now: clock.now });
  });
  afterAll(async () => {
    await client?.close();
    await db?.drop();
  });

  it('records a lapse once by itself, and leaves live and renewed grants alone', async () => {
    const body = (i: number, ms: number) => ({
      agent_id: `solo.agent${i}`,
      tool_id: 'scf.read',
      scope: 'per-tenant',
      expires_at: new Date(clock.now().getTime() + ms).toISOString(),
      rationale: 'test',
    });
    const lapsing = await client.post('/grants', { token: operator, body: body(1, 60_000) });
    const live = await client.post('/grants', { token: operator, body: body(2, 3_600_000) });
    const renewed = await client.post('/grants', { token: operator, body: body(3, 60_000) });
    await client.post(`/grants/${renewed.body.id}/renew`, {
      token: operator,
      body: { rationale: 'longer', expires_at: new Date(clock.now().getTime() + 3_600_000).toISOString() },
    });
    const expired = async () =>
      (await client.get('/audit', { token: platform, query: { event_type: 'grant.expired', limit: 500 } })).body
        .items as Array<Record<string, any>>;
    clock.advance(60_001);
    await until('the app’s sweeper to record the lapse', async () => (await expired()).length > 0, {
      timeoutMs: 3_000,
      intervalMs: 50,
    });
    // Nothing else is due: another sweep at the same time records nothing more.
    const another = new GrantExpirySweeper({
      database: db.database,
      now: clock.now,
      intervalMs: 60_000,
      logger: pino({ level: 'silent' }),
    });
    expect(await another.sweep()).toBe(0);
    const ids = (await expired()).map((e) => e.details.grant_id);
    expect(ids).toEqual([lapsing.body.id]);
    expect(ids).not.toContain(live.body.id);
  });
});
