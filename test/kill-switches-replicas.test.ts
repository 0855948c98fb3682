import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../src/db/database.js';
import { KillSwitchSnapshot } from '../src/kill-switches/kill-switch-snapshot.js';
import { hasPostgresServer, openPool } from './helpers/database.js';
import { TestBackend } from './helpers/backend.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';
import { until } from './helpers/waits.js';

// Several gateway instances on one PostgreSQL server: this file needs a real server.
const T = 'tenant-replicas';
const operator = tokens.tenantOperator(T, 'carol');
const platform = tokens.platform();
const AGENT = 'replica.worker';
const agent = tokens.agent(AGENT, { tenant: T, family: 'workers' });

async function decision(client: AppClient, query: Record<string, string>) {
  const res = await client.get('/kill-switches/decide', { token: operator, query });
  return res;
}

/** One run of one step of `tool` by the test agent, on `client`. */
function run(client: AppClient, tool: string) {
  return client.post('/runs/execute', {
    token: agent,
    body: { run_id: newRunId('replica'), context: {}, plan: [{ tool_id: tool, input: { q: 'hi' } }] },
  });
}

describe.skipIf(!hasPostgresServer)('kill switches across replicas (needs a PostgreSQL server)', () => {
  let h: Harness;
  let dbB: Database;
  let b: AppClient;
  let backend: TestBackend;

  beforeAll(async () => {
    h = await startHarness();
    dbB = await openPool(h.db.url, 5);
    b = await AppClient.start(dbB);
    backend = await new TestBackend().start();
    await registerTool(h.client, { id: 'replica.echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'replica.echo' });
    // B's catalog follows A's registration within its refresh bound.
    await until("B's catalog to know replica.echo", async () => (await run(b, 'replica.echo')).status === 200, {
      timeoutMs: 2_000,
      intervalMs: 50,
    });
  });
  afterAll(async () => {
    await backend?.close();
    await b?.close();
    await dbB?.close();
    await h?.close();
  });

  it("stops B's runs at the next step once A arms a switch (403 kill_switch_active, run killed), and lets them through once disarmed", async () => {
    const armed = await h.client.post('/kill-switches', {
      token: operator,
      body: {
        scope: 'family',
        target: 'workers',
        reason: 'runaway loop',
        user_visible_status_copy: 'Workers are paused for maintenance',
      },
    });
    await until('B to refuse under the armed switch', async () => (await run(b, 'replica.echo')).status === 403, {
      timeoutMs: 1_000,
    });
    const killed = await run(b, 'replica.echo');
    expect(killed.body).toMatchObject({
      status: 'killed',
      steps: [{ status: 'denied', error: { code: 'kill_switch_active' } }],
    });
    expect(JSON.stringify(killed.body)).toContain('Workers are paused for maintenance');
    const dispatchedBefore = backend.hits.length;
    await run(b, 'replica.echo');
    expect(backend.hits.length).toBe(dispatchedBefore);

    await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: operator, body: { reason: 'loop fixed' } });
    await until('B to admit again once disarmed', async () => (await run(b, 'replica.echo')).status === 200, {
      timeoutMs: 1_000,
    });
  });

  it("refuses B's next run once A revokes the grant (grant_revoked); a revoked grant cannot be renewed, only granted anew", async () => {
    const granted = await grantTool(h.client, {
      tenant: T,
      agent: AGENT,
      tool: 'replica.echo',
      scope: 'per-user',
      scope_ref: 'u-1',
    });
    const withUser = () =>
      b.post('/runs/execute', {
        token: agent,
        body: {
          run_id: newRunId('replica'),
          user_id: 'u-1',
          context: {},
          plan: [{ tool_id: 'replica.echo', input: { q: 'hi' } }],
        },
      });
    expect((await withUser()).status).toBe(200);
    // Leave only the per-user grant in force: revoke the tenant-wide one from beforeAll.
    const tenantWide = await h.client.get('/grants', {
      token: operator,
      query: { agent_id: AGENT, scope: 'per-tenant', status: 'live' },
    });
    for (const g of tenantWide.body.items)
      await h.client.post(`/grants/${g.id}/revoke`, { token: operator, body: { reason: 'narrowing' } });
    await h.client.post(`/grants/${granted.id}/revoke`, { token: operator, body: { reason: 'pulled' } });
    const refused = await withUser();
    expect(refused.status).toBe(403);
    expect(refused.body.steps[0].error.code).toBe('grant_revoked');

    const renewedFromOld = await h.client.post(`/grants/${granted.id}/renew`, {
      token: operator,
      body: { rationale: 'again', expires_at: new Date(Date.now() + 3600_000).toISOString() },
    });
    expect(renewedFromOld.body.error.code).toBe('grant_revoked');
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'replica.echo' });
    expect((await withUser()).status).toBe(200);
  });

  it('a switch armed through instance A denies on instance B within a second, and disarming lifts it', async () => {
    const a = h.client;
    expect((await decision(b, { agent_id: 'spreading.agent' })).body.ok).toBe(true);
    const armed = await a.post('/kill-switches', {
      token: operator,
      body: { scope: 'agent', target: 'spreading.agent', reason: 'loops', user_visible_status_copy: 'Paused' },
    });
    expect(armed.status).toBe(201);
    await until(
      'the switch to deny on B',
      async () => (await decision(b, { agent_id: 'spreading.agent' })).body.ok === false,
      { timeoutMs: 1_000 },
    );
    const onB = await decision(b, { agent_id: 'spreading.agent' });
    expect(onB.body).toMatchObject({ code: 'kill_switch_active', blamed: { id: armed.body.id } });

    await a.post(`/kill-switches/${armed.body.id}/disarm`, { token: operator, body: { reason: 'fixed' } });
    await until(
      'the disarm to reach B',
      async () => (await decision(b, { agent_id: 'spreading.agent' })).body.ok === true,
      { timeoutMs: 1_000 },
    );
  });

  it('propagates the other way too, for every arm and disarm of a quick sequence', async () => {
    for (let i = 0; i < 5; i += 1) {
      const armed = await b.post('/kill-switches', {
        token: platform,
        body: { scope: 'tool', target: `flap.tool${i}`, reason: 'flap', user_visible_status_copy: 'Paused' },
      });
      await until(
        'the switch to deny on A',
        async () => (await decision(h.client, { tool_id: `flap.tool${i}` })).body.ok === false,
        { timeoutMs: 1_000 },
      );
      await b.post(`/kill-switches/${armed.body.id}/disarm`, { token: platform, body: { reason: 'unflap' } });
      await until(
        'the disarm to reach A',
        async () => (await decision(h.client, { tool_id: `flap.tool${i}` })).body.ok === true,
        { timeoutMs: 1_000 },
      );
    }
  });

  it('arming one target from two instances at once makes one switch', async () => {
    const body = { scope: 'family', target: 'twin', reason: 'race', user_visible_status_copy: 'Paused' };
    const [fromA, fromB] = await Promise.all([
      h.client.post('/kill-switches', { token: operator, body }),
      b.post('/kill-switches', { token: operator, body }),
    ]);
    expect(fromA.body.id).toBe(fromB.body.id);
    expect([fromA.status, fromB.status].sort()).toEqual([200, 201]);
  });
});

describe.skipIf(!hasPostgresServer)('a replica that loses its database (needs a PostgreSQL server)', () => {
  let h: Harness;
  let proxy: TcpProxy;
  let dbC: Database;
  let c: AppClient;
  let backend: TestBackend;

  beforeAll(async () => {
    h = await startHarness();
    const url = new URL(h.db.url!);
    proxy = await new TcpProxy(url.hostname, Number(url.port || 5432)).start();
    dbC = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 5,
      logger: pino({ level: 'silent' }),
    });
    c = await AppClient.start(dbC);
    backend = await new TestBackend().start();
    await registerTool(h.client, { id: 'cut.echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
    await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'cut.echo' });
    await until("C's catalog to know cut.echo", async () => (await run(c, 'cut.echo')).status === 200, {
      timeoutMs: 2_000,
      intervalMs: 50,
    });
  });
  afterAll(async () => {
    await backend?.close();
    await c?.close();
    await dbC?.close();
    await proxy?.close();
    await h?.close();
  });

  it('stops admitting within 5 s (503 gateway_unavailable, /ready 503) and comes back by itself', async () => {
    expect((await decision(c, { tool_id: 'any.tool' })).status).toBe(200);
    expect((await c.get('/ready')).status).toBe(200);

    proxy.cutConnections();
    // The hard bound is 5 s from the last confirmation, which came before the cut; the slack is
    // for a loaded machine's timers, not for the gateway.
    await until('C to fail closed', async () => (await decision(c, { tool_id: 'any.tool' })).status === 503, {
      timeoutMs: 5_500,
    });
    const refused = await decision(c, { tool_id: 'any.tool' });
    expect(refused.body.error.code).toBe('gateway_unavailable');
    const hits = backend.hits.length;
    const cutRun = await run(c, 'cut.echo');
    expect(cutRun.status).toBe(503);
    expect(backend.hits.length).toBe(hits);
    const ready = await c.get('/ready');
    expect(ready.status).toBe(503);
    expect(ready.body.error.code).toBe('gateway_unavailable');
    expect(c.app.services.killSwitches.decide({ tenantId: T, toolId: 'any.tool' })).toMatchObject({
      ok: false,
      code: 'gateway_unavailable',
    });
    const metrics = await c.get('/metrics');
    const age = Number(/^toolgate_kill_switch_snapshot_age_seconds (\S+)$/m.exec(metrics.text)![1]);
    expect(age).toBeGreaterThan(5);

    // While C is cut off, a switch is armed through the healthy instance: C must not come back
    // with its old picture of the world.
    const armed = await h.client.post('/kill-switches', {
      token: operator,
      body: { scope: 'tool', target: 'armed.while.away', reason: 'outage', user_visible_status_copy: 'Paused' },
    });
    expect(armed.status).toBe(201);

    proxy.restore();
    await until(
      'C to confirm a snapshot again',
      async () => (await decision(c, { tool_id: 'armed.while.away' })).status === 200,
      { timeoutMs: 15_000, intervalMs: 50 },
    );
    expect((await decision(c, { tool_id: 'armed.while.away' })).body).toMatchObject({
      ok: false,
      blamed: { id: armed.body.id },
    });
    await until('C to be ready again', async () => (await c.get('/ready')).status === 200, {
      timeoutMs: 5_000,
      intervalMs: 50,
    });
    expect((await run(c, 'cut.echo')).status).toBe(200);

    // And its listener is back: a disarm reaches it by notification, well inside the poll bound.
    await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: operator, body: { reason: 'over' } });
    await until(
      'the disarm to reach C',
      async () => (await decision(c, { tool_id: 'armed.while.away' })).body.ok === true,
      { timeoutMs: 1_000 },
    );
  });
});

describe.skipIf(!hasPostgresServer)('a replica whose database connection hangs (needs a PostgreSQL server)', () => {
  let h: Harness;
  let proxy: TcpProxy;
  let database: Database;

  beforeAll(async () => {
    h = await startHarness();
    const url = new URL(h.db.url!);
    proxy = await new TcpProxy(url.hostname, Number(url.port || 5432)).start();
    database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 3,
      logger: pino({ level: 'silent' }),
    });
  });
  afterAll(async () => {
    await proxy?.close();
    await database?.close().catch(() => undefined);
    await h?.close();
  });

  it('stops waiting on a read that never answers, so it recovers as soon as new connections work', async () => {
    const snapshot = new KillSwitchSnapshot({
      database,
      listener: database.listener,
      registry: new Registry(),
      logger: pino({ level: 'silent' }),
      pollIntervalMs: 100,
      maxStalenessMs: 600,
    });
    await snapshot.refresh();
    expect(snapshot.decide({ tenantId: T })).toEqual({ ok: true });

    // Every open connection goes silent, the pooled one included: the next read hangs on it.
    proxy.freeze();
    await expect(snapshot.refresh()).rejects.toThrow(/unanswered/);
    expect(snapshot.decide({ tenantId: T })).toMatchObject({ ok: false, code: 'gateway_unavailable' });

    // A new connection works while the hung read's stays silent: that read must not hold the snapshot back.
    proxy.restore({ keepFrozen: true });
    await snapshot.refresh();
    expect(snapshot.decide({ tenantId: T })).toEqual({ ok: true });
    await snapshot.stop();
  });
});
