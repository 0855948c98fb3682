import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../src/db/database.js';
import { createTestDatabase, hasPostgresServer, openPool, type TestDatabase } from './helpers/database.js';
import { AppClient } from './helpers/harness.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { toolBody } from './helpers/world.js';
import { until } from './helpers/waits.js';

const platform = tokens.platform();

describe.skipIf(!hasPostgresServer)('the registry across gateway instances (needs a PostgreSQL server)', () => {
  let testDb: TestDatabase;
  let databases: Database[];
  let a: AppClient;
  let b: AppClient;

  beforeAll(async () => {
    testDb = await createTestDatabase();
    databases = await Promise.all([0, 1].map(() => openPool(testDb.url, 5)));
    // A slow revision check, so that freshness below comes from notifications.
    const slow = { TOOLGATE_REGISTRY_REFRESH_MS: '1000' };
    a = await AppClient.start(databases[0]!, slow);
    b = await AppClient.start(databases[1]!, slow);
  });

  afterAll(async () => {
    await Promise.all([a, b].map((client) => client?.close()));
    await Promise.all((databases ?? []).map((database) => database.close()));
    await testDb?.drop();
  });

  async function registrations(toolId: string): Promise<number> {
    const events = await a.get('/audit', {
      token: platform,
      query: { event_type: 'tool.registered', tool_id: toolId },
    });
    return events.body.items.length;
  }

  it('lets one of two identical concurrent registrations win; the other gets the idempotent answer', async () => {
    const body = toolBody({ id: 'race.identical', allowed_agents: ['scf.analyst'] });
    const answers = await Promise.all([a, b].map((client) => client.post('/tools', { token: platform, body })));
    expect(answers.map((r) => r.status).sort()).toEqual([200, 201]);
    expect(answers[0]!.body).toEqual(answers[1]!.body);
    expect(await registrations('race.identical')).toBe(1);
  });

  it('gives the conflict to the loser when the concurrent contents differ', async () => {
    const answers = await Promise.all([
      a.post('/tools', { token: platform, body: toolBody({ id: 'race.different', cost_units: 1 }) }),
      b.post('/tools', { token: platform, body: toolBody({ id: 'race.different', cost_units: 2 }) }),
    ]);
    expect(answers.map((r) => r.status).sort()).toEqual([201, 409]);
    const loser = answers.find((r) => r.status === 409)!;
    expect(loser.body.error).toMatchObject({
      code: 'tool_version_conflict',
      details: { differing_fields: ['cost_units'] },
    });
    const winner = answers.find((r) => r.status === 201)!;
    // B's copy may be up to a refresh behind A's commit.
    await until("B's catalog to know race.different", () => b.app.services.catalog.resolve('race.different').ok, {
      timeoutMs: 1000,
    });
    const stored = await b.get('/tools/race.different', { token: platform });
    expect(stored.body.cost_units).toBe(winner.body.cost_units);
    expect(await registrations('race.different')).toBe(1);
  });

  it('stores exactly one version under a burst of identical registrations from both instances', async () => {
    const body = toolBody({ id: 'race.burst' });
    const answers = await Promise.all(
      Array.from({ length: 12 }, (_, i) => (i % 2 ? a : b).post('/tools', { token: platform, body })),
    );
    expect(answers.filter((r) => r.status === 201)).toHaveLength(1);
    expect(answers.filter((r) => r.status === 200)).toHaveLength(11);
    expect(await registrations('race.burst')).toBe(1);
  });

  it("shows a registration made through one instance in the other's catalog within a second", async () => {
    const res = await a.post('/tools', { token: platform, body: toolBody({ id: 'fresh.tool' }) });
    expect(res.status).toBe(201);
    expect(a.app.services.catalog.resolve('fresh.tool').ok).toBe(true);
    await until("B's catalog to know fresh.tool", () => b.app.services.catalog.resolve('fresh.tool').ok, {
      timeoutMs: 1000,
    });
    expect(b.app.services.catalog.revision).toBe(a.app.services.catalog.revision);
  });

  it('catches up by its revision check when a notification is lost', async () => {
    // A change committed without NOTIFY, as if the notification had been lost in transit.
    const db = databases[0]!.control;
    await db.transaction().execute(async (trx) => {
      const { revision } = await trx
        .selectFrom('registry_revision')
        .select('revision')
        .forUpdate()
        .executeTakeFirstOrThrow();
      const next = Number(revision) + 1;
      // The contract as registration stores it (its defaults filled in).
      const content = { ...toolBody({ id: 'silent.tool' }), egress: null, deprecation: undefined };
      await sql`insert into tool_versions (tool_id, version, contract, content_sha256, registered_at, registered_by, revision)
                values ('silent.tool', '1.0.0', ${JSON.stringify(content)}::jsonb, ${'0'.repeat(64)}, now(), 'operator:test', ${next})`.execute(
        trx,
      );
      await trx.updateTable('registry_revision').set({ revision: next }).execute();
    });
    // The revision check runs every second here; allow it one period plus the load.
    await until(
      'both catalogs to know silent.tool',
      () => a.app.services.catalog.resolve('silent.tool').ok && b.app.services.catalog.resolve('silent.tool').ok,
      { timeoutMs: 2000 },
    );
  });

  it('starts without its database, serves its last copy while cut off, and catches up when the database returns', async () => {
    const server = new URL(testDb.url!);
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    proxy.cutConnections();
    const database = await openDatabase({
      databaseUrl: proxy.urlFor(testDb.url!),
      dataDir: '',
      poolSize: 2,
      logger: pino({ level: 'silent' }),
    });
    const c = await AppClient.start(database, { TOOLGATE_REGISTRY_REFRESH_MS: '200' });
    try {
      const catalog = c.app.services.catalog;
      expect(catalog.readiness().ok).toBe(false);
      expect(catalog.resolve('fresh.tool').ok).toBe(false);
      // Over HTTP it fails closed: not ready (answered from what it knows, before any ping), no
      // empty catalog, and no "no such tool" for a grant.
      const ready = await c.get('/ready');
      expect(ready.status).toBe(503);
      expect(ready.body.error.details).toEqual({ check: 'snapshot' });
      const listed = await c.get('/tools', { token: platform });
      expect(listed.status).toBe(503);
      expect(listed.body.error.code).toBe('gateway_unavailable');
      const grant = await c.post('/grants', {
        token: tokens.tenantOperator('t-registry'),
        body: {
          agent_id: 'some.agent',
          tool_id: 'fresh.tool',
          scope: 'per-tenant',
          rationale: 'needs it',
          expires_at: '2099-01-01T00:00:00Z',
        },
      });
      expect(grant.status).toBe(503);
      expect(grant.body.error.code).toBe('gateway_unavailable');

      proxy.restore();
      await until('the catalog to load fresh.tool', () => catalog.resolve('fresh.tool').ok, { timeoutMs: 5000 });
      expect(catalog.readiness().ok).toBe(true);
      expect((await c.get('/tools', { token: platform })).status).toBe(200);

      proxy.cutConnections();
      const res = await a.post('/tools', { token: platform, body: toolBody({ id: 'while.away' }) });
      expect(res.status).toBe(201);
      await new Promise((resolve) => setTimeout(resolve, 300));
      expect(catalog.resolve('fresh.tool').ok).toBe(true);
      expect(catalog.resolve('while.away').ok).toBe(false);

      proxy.restore();
      await until('the catalog to catch up with while.away', () => catalog.resolve('while.away').ok, {
        timeoutMs: 5000,
      });
    } finally {
      await c.close();
      await database.close();
      await proxy.close();
    }
  });
});
