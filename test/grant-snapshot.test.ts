import { EventEmitter } from 'node:events';
import { sql } from 'kysely';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Database, NotificationListener } from '../src/db/database.js';
import { GrantAdmission } from '../src/grants/grant-admission.js';
import { GrantSnapshot } from '../src/grants/grant-snapshot.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer, openPool } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

// Several gateway instances on one PostgreSQL server: this file needs a real server.
const T = 'tenant-grant-snapshot';
const AGENT = 'snapshot.worker';
const operator = tokens.tenantOperator(T, 'carol');
const agent = tokens.agent(AGENT, { tenant: T });
const TOOLS = ['snap.notified', 'snap.lost', 'snap.renewed', 'snap.narrowed', 'snap.created', 'snap.stale'];

/** A listener that never delivers: every notification to this replica is lost. */
function deafListener(): NotificationListener {
  return Object.assign(new EventEmitter(), {
    connected: true,
    subscribe: async () => undefined,
    close: async () => undefined,
  });
}

function run(client: AppClient, tool: string) {
  return client.post('/runs/execute', {
    token: agent,
    body: { run_id: newRunId('snap'), context: {}, plan: [{ tool_id: tool, input: { q: 'hi' } }] },
  });
}

async function counted(client: AppClient, name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = client.app.services.metrics.registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name}`);
  const { values } = await metric.get();
  return values
    .filter((value) => Object.entries(labels).every(([key, wanted]) => value.labels[key] === wanted))
    .reduce((sum, value) => sum + value.value, 0);
}

describe.skipIf(!hasPostgresServer)('the grant snapshot across replicas (needs a PostgreSQL server)', () => {
  let h: Harness;
  let dbB: Database;
  let dbC: Database;
  /** B follows A's changes by notification. */
  let b: AppClient;
  /** C hears no notification: only its version check (every 4 s) catches it up. */
  let c: AppClient;
  let backend: TestBackend;

  const databaseVersion = async () =>
    Number(
      (await sql<{ version: string }>`select version from grant_state`.execute(h.db.database.control)).rows[0]!.version,
    );
  const caughtUp = async (client: AppClient) =>
    client.app.services.grantSnapshot.state().version >= (await databaseVersion());
  // C's copy was confirmed a moment ago, so its next check is seconds away.
  const justChecked = (client: AppClient) =>
    until("C's periodic check", () => client.app.services.grantSnapshot.state().age_ms < 500, {
      timeoutMs: 6_000,
    });

  beforeAll(async () => {
    h = await startHarness();
    backend = await new TestBackend().start();
    for (const id of TOOLS) {
      await registerTool(h.client, { id, backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
    }
    dbB = await openPool(h.db.url, 5);
    b = await AppClient.start(dbB);
    dbC = await openPool(h.db.url, 5);
    c = await AppClient.start({ ...dbC, listener: deafListener() }, { TOOLGATE_KILL_SWITCH_POLL_MS: '4000' });
  });
  afterAll(async () => {
    await backend?.close();
    await b?.close();
    await c?.close();
    await dbB?.close();
    await dbC?.close();
    await h?.close();
  });

  it("decides B's calls from its copy, and refuses B's next call once A's revocation reaches it by notification", async () => {
    const granted = await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'snap.notified' });
    await until("B's copy to hold the grant", () => caughtUp(b), { timeoutMs: 2_000 });
    const fromSnapshot = await counted(b, 'toolgate_grant_decisions_total', { source: 'snapshot' });
    const fromDatabase = await counted(b, 'toolgate_grant_decisions_total', { source: 'database' });
    expect((await run(b, 'snap.notified')).status).toBe(200);
    expect(await counted(b, 'toolgate_grant_decisions_total', { source: 'snapshot' })).toBe(fromSnapshot + 1);
    expect(await counted(b, 'toolgate_grant_decisions_total', { source: 'database' })).toBe(fromDatabase);

    await h.client.post(`/grants/${granted.id}/revoke`, { token: operator, body: { reason: 'pulled' } });
    await until("B's copy to drop the grant", () => caughtUp(b), { timeoutMs: 2_000 });
    const guardFailures = await counted(b, 'toolgate_grant_guard_failures_total');
    const refused = await run(b, 'snap.notified');
    expect(refused.status).toBe(403);
    expect(refused.body.steps[0].error.code).toBe('grant_revoked');
    // The copy no longer held the grant: the database refused, no guard had to.
    expect(await counted(b, 'toolgate_grant_guard_failures_total')).toBe(guardFailures);
  });

  it("refuses C's next call after A revokes even though C never heard of it: the guarded write catches the stale copy", async () => {
    const granted = await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'snap.lost' });
    await until("C's check to bring the grant", () => caughtUp(c), { timeoutMs: 6_000, intervalMs: 50 });
    await justChecked(c);
    expect((await run(c, 'snap.lost')).status).toBe(200);
    const seen = c.app.services.grantSnapshot.state().version;
    const guardFailures = await counted(c, 'toolgate_grant_guard_failures_total');
    const dispatched = backend.hits.length;

    await h.client.post(`/grants/${granted.id}/revoke`, { token: operator, body: { reason: 'pulled' } });
    const refused = await run(c, 'snap.lost');
    expect(refused.status).toBe(403);
    expect(refused.body).toMatchObject({ steps: [{ status: 'denied', error: { code: 'grant_revoked' } }] });
    expect(backend.hits.length).toBe(dispatched);
    // C's copy still held the grant as live: the guard refused the use, the database decided.
    expect(c.app.services.grantSnapshot.state().version).toBe(seen);
    expect(await counted(c, 'toolgate_grant_guard_failures_total')).toBe(guardFailures + 1);
  });

  it("admits C's next call under the new grant after A renews it, though C's copy still names the old one", async () => {
    const old = await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'snap.renewed' });
    await until("C's check to bring the grant", () => caughtUp(c), { timeoutMs: 6_000, intervalMs: 50 });
    await justChecked(c);
    const seen = c.app.services.grantSnapshot.state().version;
    const renewed = await h.client.post(`/grants/${old.id}/renew`, {
      token: operator,
      body: { rationale: 'still needed', expires_at: new Date(Date.now() + 7200_000).toISOString() },
    });
    expect(renewed.status).toBe(201);
    const guardFailures = await counted(c, 'toolgate_grant_guard_failures_total');
    const admitted = await run(c, 'snap.renewed');
    expect(admitted.status).toBe(200);
    expect(c.app.services.grantSnapshot.state().version).toBe(seen);
    expect(await counted(c, 'toolgate_grant_guard_failures_total')).toBe(guardFailures + 1);
    // The run relies on the grant that is live, not on the one C's copy named.
    const uses = await sql<{ grant_id: string }>`
      select grant_id from run_grant_uses where run_id = ${admitted.body.run_id}`.execute(h.db.database.control);
    expect(uses.rows.map((row) => row.grant_id)).toEqual([renewed.body.id]);
  });

  it("applies a more specific grant A just created to C's next call, though C's copy offers only the tenant-wide one", async () => {
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'snap.narrowed' });
    await until("C's check to bring the grant", () => caughtUp(c), { timeoutMs: 6_000, intervalMs: 50 });
    await justChecked(c);
    const seen = c.app.services.grantSnapshot.state().version;
    const specific = await grantTool(h.client, {
      tenant: T,
      agent: AGENT,
      tool: 'snap.narrowed',
      scope: 'per-user',
      scope_ref: 'u-2',
    });
    const guardFailures = await counted(c, 'toolgate_grant_guard_failures_total');
    const admitted = await c.post('/runs/execute', {
      token: agent,
      body: {
        run_id: newRunId('snap'),
        user_id: 'u-2',
        context: {},
        plan: [{ tool_id: 'snap.narrowed', input: { q: 'hi' } }],
      },
    });
    expect(admitted.status).toBe(200);
    expect(c.app.services.grantSnapshot.state().version).toBe(seen);
    // C's copy chose the tenant-wide grant; the guard saw a newer grant of the tool and the
    // database chose the per-user one, as it would have without a copy.
    expect(await counted(c, 'toolgate_grant_guard_failures_total')).toBe(guardFailures + 1);
    const uses = await sql<{ grant_id: string }>`
      select grant_id from run_grant_uses where run_id = ${admitted.body.run_id}`.execute(h.db.database.control);
    expect(uses.rows.map((row) => row.grant_id)).toEqual([specific.id]);
  });

  it('admits a call on C at once for a grant A just created: a grant missing from the copy is looked up, not refused', async () => {
    await justChecked(c);
    const seen = c.app.services.grantSnapshot.state().version;
    const fromDatabase = await counted(c, 'toolgate_grant_decisions_total', { source: 'database' });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'snap.created', scope: 'per-user', scope_ref: 'u-1' });
    const admitted = await c.post('/runs/execute', {
      token: agent,
      body: {
        run_id: newRunId('snap'),
        user_id: 'u-1',
        context: {},
        plan: [{ tool_id: 'snap.created', input: { q: 'hi' } }],
      },
    });
    expect(admitted.status).toBe(200);
    expect(c.app.services.grantSnapshot.state().version).toBe(seen);
    expect(await counted(c, 'toolgate_grant_decisions_total', { source: 'database' })).toBe(fromDatabase + 1);
  });

  it('decides nothing from a copy past its staleness bound, and decides from it again once confirmed', async () => {
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'snap.stale' });
    let t = 0;
    const registry = new Registry();
    const snapshot = new GrantSnapshot({
      db: h.db.database.control,
      listener: deafListener(),
      registry,
      logger: pino({ level: 'silent' }),
      pollIntervalMs: 60_000,
      maxStalenessMs: 1_000,
      now: () => new Date(),
      clock: () => t,
    });
    const exactCalls: string[] = [];
    const admission = new GrantAdmission(
      snapshot,
      {
        resolve: async (query) => {
          exactCalls.push(query.toolId);
          return { ok: false, code: 'grant_revoked', candidates: [] };
        },
        prefetch: (query) => ({ query, candidates: Promise.resolve([]) }),
      },
      () => new Date(),
      registry,
    );
    const query = { tenantId: T, agentId: AGENT, toolId: 'snap.stale', context: { run_id: 'r-1' } };
    try {
      await snapshot.start();
      expect(snapshot.resolve(query, { tenant_id: T, run_id: 'r-1' }, new Date())).toMatchObject({ ok: true });
      expect(await admission.resolve(query)).toMatchObject({ ok: true, assumed: { toolId: 'snap.stale' } });
      expect(exactCalls).toEqual([]);

      t += 1_001;
      expect(snapshot.resolve(query, { tenant_id: T, run_id: 'r-1' }, new Date())).toEqual({
        ok: false,
        reason: 'stale',
      });
      // The stale copy is not consulted: the database's answer is the answer.
      expect(await admission.resolve(query)).toEqual({ ok: false, code: 'grant_revoked', candidates: [] });
      expect(exactCalls).toEqual(['snap.stale']);
      const age = (await registry.getSingleMetric('toolgate_grant_snapshot_age_seconds')!.get()).values[0]!.value;
      expect(age).toBeGreaterThan(1);

      await snapshot.refresh();
      expect(snapshot.state().age_ms).toBe(0);
      expect(await admission.resolve(query)).toMatchObject({ ok: true });
      expect(exactCalls).toEqual(['snap.stale']);
    } finally {
      await snapshot.stop();
    }
  });
});
