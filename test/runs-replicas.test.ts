import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase, type Database } from '../src/db/database.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { createBudget, grantTool, newRunId, registerTool } from './helpers/world.js';
import { until } from './helpers/waits.js';

// Several gateway instances on one database: each has its own pool, caches and snapshots.
describe.skipIf(!hasPostgresServer)('runs across gateway instances (needs a PostgreSQL server)', () => {
  const T = 'tenant-replicas';
  const AGENT = 'replica.agent';
  const agent = tokens.agent(AGENT, { tenant: T });
  const logger = pino({ level: 'silent' });
  let h: Harness;
  let backend: TestBackend;
  const extra: Array<{ database: Database; client: AppClient }> = [];
  let instances: AppClient[];

  const run = (client: AppClient, plan: unknown[], runId = newRunId()) =>
    client.post('/runs/execute', { token: agent, body: { run_id: runId, context: {}, plan } });

  beforeAll(async () => {
    h = await startHarness();
    backend = await new TestBackend().start();
    for (let i = 0; i < 2; i += 1) {
      const database = await openDatabase({ databaseUrl: h.db.url, dataDir: '', poolSize: 10, logger });
      extra.push({ database, client: await AppClient.start(database) });
    }
    instances = [h.client, ...extra.map((e) => e.client)];
    const base = { allowed_agents: [AGENT] };
    await registerTool(h.client, { id: 'metered', backendUrl: `${backend.url}/echo`, cost_units: 1, ...base });
    await registerTool(h.client, {
      id: 'bucketed',
      backendUrl: `${backend.url}/echo`,
      cost_units: 0,
      rate_limit: { capacity: 10, refill_per_second: 2 },
      ...base,
    });
    await registerTool(h.client, { id: 'gated', backendUrl: `${backend.url}/gate`, cost_units: 0, ...base });
    await registerTool(h.client, { id: 'after.gate', backendUrl: `${backend.url}/echo`, cost_units: 0, ...base });
    for (const tool of ['metered', 'bucketed', 'gated', 'after.gate'])
      await grantTool(h.client, { tenant: T, agent: AGENT, tool });
    await createBudget(h.client, { tenant: T, scope: 'agent', agent_id: AGENT, limit_units: 50, warn_ratio: 1 });
    // Every instance's catalog must know the tools before the runs start.
    for (const client of instances)
      await until('every catalog to know the tools', () => client.app.services.catalog.resolve('after.gate').ok, {
        intervalMs: 50,
      });
  });

  afterAll(async () => {
    for (const e of extra) {
      await e.client.close();
      await e.database.close();
    }
    await backend?.close();
    await h?.close();
  });

  it('three instances sharing one budget admit exactly what it allows under 200 concurrent runs', async () => {
    const before = backend.hitsOn('/echo').length;
    const answers = await Promise.all(
      Array.from({ length: 200 }, (_, i) =>
        run(instances[i % 3]!, [{ tool_id: 'metered', input: { q: `call ${i}` } }]),
      ),
    );
    const statuses = answers.map((a) => a.status);
    expect(statuses.filter((s) => s === 200)).toHaveLength(50);
    expect(statuses.filter((s) => s === 402)).toHaveLength(150);
    expect(backend.hitsOn('/echo').length - before).toBe(50);
    const budgets = await h.client.get('/budgets', { token: tokens.tenantOperator(T) });
    expect(budgets.body.items[0]).toMatchObject({ spent_units: 50, reserved_units: 0 });
  });

  it('three instances sharing one bucket admit no more than capacity + refill × elapsed', async () => {
    const started = performance.now();
    const answers = await Promise.all(
      Array.from({ length: 60 }, (_, i) => run(instances[i % 3]!, [{ tool_id: 'bucketed', input: { q: `b ${i}` } }])),
    );
    const elapsedSeconds = (performance.now() - started) / 1000;
    const admitted = answers.filter((a) => a.status === 200).length;
    expect(admitted).toBeGreaterThanOrEqual(10);
    expect(admitted).toBeLessThanOrEqual(10 + Math.floor(2 * elapsedSeconds) + 1);
    const throttled = answers.filter((a) => a.status === 429);
    expect(throttled.length).toBe(60 - admitted);
    for (const answer of throttled) {
      expect(answer.body.status).toBe('throttled');
      expect(Number(answer.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    }
  });

  it('a kill switch armed through one instance mid-plan stops the remaining steps on another', async () => {
    const [armer, runner] = [instances[0]!, instances[1]!];
    const hitsBefore = backend.hitsOn('/gate').length;
    const answer = run(runner, [
      { tool_id: 'gated', input: { q: 'first' } },
      { tool_id: 'after.gate', input: { q: 'second' } },
      { tool_id: 'after.gate', input: { q: 'third' } },
    ]);
    await backend.waitForHits('/gate', hitsBefore + 1);
    const armed = await armer.post('/kill-switches', {
      token: tokens.tenantOperator(T),
      body: {
        scope: 'agent',
        target: AGENT,
        reason: 'misbehaving in test',
        user_visible_status_copy: 'Paused by the operator',
      },
    });
    expect(armed.status).toBe(201);
    // Wait until the running instance's snapshot has it, then let the first step finish.
    await until(
      'the running instance to know the switch',
      async () =>
        (await runner.get('/kill-switches/decide', { token: tokens.tenantOperator(T), query: { agent_id: AGENT } }))
          .body.ok === false,
    );
    backend.openGate();
    const res = await answer;
    expect(res.status).toBe(403);
    expect(res.body.status).toBe('killed');
    expect(res.body.steps.map((s: { status: string }) => s.status)).toEqual(['completed', 'denied', 'skipped']);
    expect(res.body.steps[1].error).toMatchObject({ code: 'kill_switch_active', message: 'Paused by the operator' });
    await armer.post(`/kill-switches/${armed.body.id}/disarm`, {
      token: tokens.tenantOperator(T),
      body: { reason: 'test over' },
    });
  });
});

describe.skipIf(!hasPostgresServer)('a database lost mid-run (needs a PostgreSQL server)', () => {
  const T = 'tenant-outage';
  const AGENT = 'outage.agent';
  const agent = tokens.agent(AGENT, { tenant: T });
  let h: Harness;
  let backend: TestBackend;
  let proxy: TcpProxy;
  let database: Database;
  let client: AppClient;

  beforeAll(async () => {
    h = await startHarness();
    backend = await new TestBackend().start();
    const server = new URL(h.db.url!);
    proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 5,
      logger: pino({ level: 'silent' }),
    });
    client = await AppClient.start(database);
    const base = { allowed_agents: [AGENT], cost_units: 0 };
    await registerTool(client, { id: 'gated', backendUrl: `${backend.url}/gate`, ...base });
    await registerTool(client, { id: 'echo', backendUrl: `${backend.url}/echo`, ...base });
    for (const tool of ['gated', 'echo']) await grantTool(client, { tenant: T, agent: AGENT, tool });
  });

  afterAll(async () => {
    await client?.close();
    await database?.close();
    await proxy?.close();
    await backend?.close();
    await h?.close();
  });

  it('dispatches nothing more, answers 503, and leaves no backend call without its intent record', async () => {
    const runId = newRunId();
    const answer = client.post('/runs/execute', {
      token: agent,
      body: {
        run_id: runId,
        context: {},
        plan: [
          { tool_id: 'gated', input: { q: 'one' } },
          { tool_id: 'echo', input: { q: 'two' } },
        ],
      },
    });
    await backend.waitForHits('/gate', 1);
    proxy.cutConnections();
    backend.openGate();
    const res = await answer;
    expect(res.status).toBe(503);
    expect(res.body.error.code).toBe('gateway_unavailable');
    expect(backend.hitsOn('/echo')).toHaveLength(0);

    // While the database is away, nothing reaches a backend.
    const during = await client.post('/runs/execute', {
      token: agent,
      body: { run_id: newRunId(), context: {}, plan: [{ tool_id: 'echo', input: { q: 'three' } }] },
    });
    expect(during.status).toBe(503);
    expect(backend.hitsOn('/echo')).toHaveLength(0);

    proxy.restore();
    const intents = await h.client.get('/audit', {
      token: tokens.platform(),
      query: { run_id: runId, event_type: 'run.step.dispatching' },
    });
    const recorded = new Set(intents.body.items.map((e: { tool_call_id: string }) => e.tool_call_id));
    for (const hit of backend.hits) expect(recorded.has(hit.headers['x-toolgate-tool-call-id'])).toBe(true);
    expect(backend.hits).toHaveLength(1);
  });

  it('answers a dry run during the outage 503 gateway_unavailable, whichever stage meets it first', async () => {
    const dry = () =>
      client.post('/runs/execute', {
        token: agent,
        body: { run_id: newRunId(), context: {}, dry_run: true, plan: [{ tool_id: 'echo', input: { q: 'dry' } }] },
      });
    let before = await dry();
    for (let i = 0; i < 50 && before.status !== 200; i += 1) {
      await new Promise((r) => setTimeout(r, 100));
      before = await dry();
    }
    expect(before.body.steps[0].status).toBe('admissible');
    proxy.cutConnections();
    try {
      // The registry copy is still confirmed: the grant stage meets the outage.
      const early = await dry();
      expect(early.status).toBe(503);
      expect(early.body.error.code).toBe('gateway_unavailable');
      // Once it is not, the registry stage meets it first: the same answer.
      await until('the registry copy to go unconfirmed', () => !client.app.services.catalog.readiness().ok, {
        timeoutMs: 20_000,
        intervalMs: 100,
      });
      const late = await dry();
      expect(late.status).toBe(503);
      expect(late.body.error.code).toBe('gateway_unavailable');
    } finally {
      proxy.restore();
    }
  });
});
