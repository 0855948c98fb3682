import { once } from 'node:events';
import { connect, type AddressInfo } from 'node:net';
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openDatabase } from '../src/db/database.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';
import { lockWaits, until } from './helpers/waits.js';
import { asCutOff } from './helpers/runs.js';

// What happens on real connections around a call in flight: its client going away, and the
// replica shutting down (a rolling deploy sends SIGTERM, which closes the app: src/server.ts).
// Either way the call must finish — audited, its run ended — and never be left busy.
const T = 'tenant-lifecycle';
const AGENT = 'lifecycle.agent';
const agent = tokens.agent(AGENT, { tenant: T, family: 'lifecycle' });

let h: Harness;
let backend: TestBackend;
let port: number;
let base: string;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await registerTool(h.client, {
    id: 'gated',
    backendUrl: `${backend.url}/gate`,
    allowed_agents: [AGENT],
    timeout_ms: 10_000,
  });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'gated' });
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  port = (h.client.app.server.address() as AddressInfo).port;
  base = `http://127.0.0.1:${port}`;
});

/** POST /runs/execute over a real connection: one step calling the gated tool with `q`. */
function postExecute(runId: string, q: string, signal?: AbortSignal): Promise<Response> {
  return fetch(`${base}/runs/execute`, {
    method: 'POST',
    headers: { authorization: `Bearer ${agent}`, 'content-type': 'application/json' },
    body: JSON.stringify({ run_id: runId, context: {}, plan: [{ tool_id: 'gated', input: { q } }] }),
    ...(signal ? { signal } : {}),
  });
}

function runOf(runId: string): Promise<{ status: string; busy: boolean }> {
  return h.db.database.control
    .selectFrom('runs')
    .select(['status', 'busy'])
    .where('tenant_id', '=', T)
    .where('run_id', '=', runId)
    .executeTakeFirstOrThrow();
}

async function waitForHit(runId: string): Promise<void> {
  await until('the call to reach the backend', () => backend.hitsOfRun(runId).length > 0);
  expect(backend.hitsOfRun(runId)).toHaveLength(1);
}

async function auditedEvents(runId: string): Promise<string[]> {
  const events = await h.db.database.control
    .selectFrom('audit_events')
    .select('event_type')
    .where('run_id', '=', runId)
    .orderBy('seq')
    .execute();
  return events.map((e) => e.event_type);
}

afterAll(async () => {
  await backend?.close();
  await h?.db.drop();
});

/** Whether a new connection to `port` is refused (nobody listening). */
async function refused(): Promise<boolean> {
  const socket = connect(port, '127.0.0.1');
  const answer = await new Promise<boolean>((resolve) => {
    socket.once('connect', () => resolve(false));
    socket.once('error', (error: NodeJS.ErrnoException) => resolve(error.code === 'ECONNREFUSED'));
  });
  socket.destroy();
  return answer;
}

describe('a client that goes away mid-call', () => {
  it('does not stop the call: it finishes, audited, and the owner gets its answer by asking again', async () => {
    const runId = newRunId('abandoned');
    const aborted = new AbortController();
    const gone = postExecute(runId, 'abandoned', aborted.signal).catch((error: unknown) => error);
    await waitForHit(runId);
    aborted.abort();
    expect(await gone).toBeInstanceOf(Error);
    backend.openGate();

    await until('the run to be let go', async () => !(await runOf(runId)).busy);
    expect(await runOf(runId)).toEqual({ status: 'completed', busy: false });
    expect(await auditedEvents(runId)).toEqual(['run.step.dispatching', 'run.step.completed']);

    // The same request again replays the stored answer; the backend is not called twice.
    const again = await postExecute(runId, 'abandoned');
    expect(again.status).toBe(200);
    expect(again.headers.get('x-toolgate-replayed')).toBe('true');
    expect(await again.json()).toMatchObject({
      status: 'completed',
      steps: [{ status: 'completed', output: { echo: { q: 'abandoned' } } }],
    });
    expect(backend.hitsOfRun(runId)).toHaveLength(1);
  });
});

describe('closing the app (SIGTERM)', () => {
  it('lets a call in flight finish (answered, audited, its run ended), refuses what arrives meanwhile, and is not held open by keep-alive', async () => {
    const app = h.client.app;
    const runId = newRunId('draining');
    // A request whose headers are still arriving when closing begins (a raw connection).
    const late = connect(port, '127.0.0.1');
    await once(late, 'connect');
    late.write('GET /ready HTTP/1.1\r\nhost: toolgate\r\n');
    const inFlight = postExecute(runId, 'in flight');
    await waitForHit(runId);

    let closed = false;
    const closing = app.close().then(() => {
      closed = true;
    });
    // Closing stops listening: a new connection finds nobody, while the call is still in flight.
    await until('the port to refuse connections', refused, { timeoutMs: 2_000, intervalMs: 20 });
    expect(closed).toBe(false);
    // A request that still reaches the app, on a connection opened before, is refused in the
    // error envelope, and its connection closed.
    let reply = '';
    late.on('data', (chunk: Buffer) => (reply += chunk.toString('utf8')));
    late.end('\r\n');
    await once(late, 'close');
    const [head, body] = reply.split('\r\n\r\n');
    expect(head).toMatch(/^HTTP\/1\.1 503 /);
    expect(head!.toLowerCase()).toContain('connection: close');
    expect(JSON.parse(body!)).toEqual({
      error: { code: 'gateway_unavailable', message: 'the gateway is shutting down', details: {} },
    });
    backend.openGate();
    const answer = await inFlight;
    expect(answer.status).toBe(200);
    const envelope = (await answer.json()) as {
      status: string;
      steps: Array<{ status: string; output: unknown; audit_id: string }>;
    };
    expect(envelope.status).toBe('completed');
    expect(envelope.steps[0]).toMatchObject({ status: 'completed', output: { echo: { q: 'in flight' } } });
    // The answer closed its connection: nothing holds the server open until a keep-alive timeout.
    await Promise.race([closing, new Promise((r) => setTimeout(r, 5_000))]);
    expect(closed).toBe(true);

    expect(await runOf(runId)).toEqual({ status: 'completed', busy: false });
    const events = await h.db.database.control
      .selectFrom('audit_events')
      .select(['event_type', 'event_id'])
      .where('run_id', '=', runId)
      .orderBy('seq')
      .execute();
    expect(events.map((e) => e.event_type)).toEqual(['run.step.dispatching', 'run.step.completed']);
    expect(events[1]!.event_id).toBe(envelope.steps[0]!.audit_id);
  });
});

describe.skipIf(!hasPostgresServer)(
  'closing the app and its database through a proxy (needs a PostgreSQL server)',
  () => {
    /** An app whose every connection to the database goes through `proxy`; its background work runs every few hundred ms. */
    async function proxiedApp() {
      const server = new URL(h.db.url!);
      const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
      const database = await openDatabase({
        databaseUrl: proxy.urlFor(h.db.url!),
        dataDir: '',
        poolSize: 4,
        logger: pino({ level: 'silent' }),
      });
      const client = await AppClient.start(database, {
        TOOLGATE_REPLICA_LEASE_MS: '900',
        TOOLGATE_GRANT_EXPIRY_SWEEP_MS: '200',
      });
      // Connections in every pool, idle once the calls are over.
      for (let i = 0; i < 3; i += 1)
        await Promise.all([client.get('/ready'), client.get('/audit', { token: tokens.platform() })]);
      return { proxy, database, client, replicaId: client.app.services.lease.id };
    }

    const replicaRow = (id: string) =>
      h.db.database.control.selectFrom('replicas').select('id').where('id', '=', id).executeTakeFirst();

    it('gives the replica lease up when the database answers', async () => {
      const { proxy, database, client, replicaId } = await proxiedApp();
      try {
        expect(await replicaRow(replicaId)).toBeDefined();
        await client.close();
        await database.close();
        expect(await replicaRow(replicaId)).toBeUndefined();
      } finally {
        await proxy.close();
      }
    });

    // A healthy but busy database: a background round the close stops waiting for (here recovery,
    // held on a run another session has locked) is cut mid-transaction when the database closes.
    // Nothing of it is committed, and another replica ends the run later, once.
    it('rolls back a recovery round it stops waiting for, and another replica recovers the run', async () => {
      const { proxy, database, client } = await proxiedApp();
      // Another replica, whose own sweeps stay out of the way (a long lease: a slow sweep).
      const other = await AppClient.start(h.db.database, { TOOLGATE_REPLICA_LEASE_MS: '600000' });
      const holder = new pg.Client({ connectionString: h.db.url });
      await holder.connect();
      try {
        // A run whose call completed, put back as a crash after the outcome record leaves it.
        const runId = newRunId('cut');
        const body = { run_id: runId, context: {}, plan: [{ tool_id: 'gated', input: { q: 'cut' } }] };
        const answer = other.post('/runs/execute', { token: agent, body });
        await waitForHit(runId);
        backend.openGate();
        expect((await answer).status).toBe(200);
        const run = () =>
          h.db.database.control.updateTable('runs').where('tenant_id', '=', T).where('run_id', '=', runId);
        const runState = () =>
          h.db.database.control
            .selectFrom('runs')
            .select(['status', 'busy'])
            .where('tenant_id', '=', T)
            .where('run_id', '=', runId)
            .executeTakeFirstOrThrow();
        await run().set(asCutOff(body)).execute();
        await holder.query('begin');
        await holder.query('select 1 from runs where tenant_id = $1 and run_id = $2 for update', [T, runId]);
        // The closing replica's recovery round waits on the lock (its sweep runs every 450 ms).
        await until('the recovery round to wait for the run', async () => (await lockWaits(holder)) > 0, {
          intervalMs: 20,
        });
        expect(await lockWaits(holder)).toBe(1);
        await client.close();
        await database.close();
        await holder.query('commit');
        expect(await runState()).toEqual({ status: 'running', busy: true });
        expect(await auditedEvents(runId)).toEqual(['run.step.dispatching', 'run.step.completed']);
        expect(await other.app.services.recovery.recoverIfLost({ tenant_id: T, run_id: runId })).toBe(true);
        expect(await runState()).toEqual({ status: 'completed', busy: false });
        expect(await auditedEvents(runId)).toEqual(['run.step.dispatching', 'run.step.completed', 'run.executor_lost']);
      } finally {
        await holder.end();
        await other.close();
        await proxy.close();
      }
    });

    // A silent partition: connections stay open, nothing crosses them. The close gives each step
    // that needs the database up after a short wait and destroys the connections still waiting,
    // instead of waiting for answers that never come. (The test's time limit is a liveness bound,
    // under the client's 20 s query timeout: a close that waits on any statement's timeout is one
    // the shutdown timeout kills.)
    it('completes during a silent partition, leaving the lease to lapse', { timeout: 19_000 }, async () => {
      const { proxy, database, client, replicaId } = await proxiedApp();
      try {
        proxy.freeze();
        // Background rounds (lease renewal, sweeps, registry checks) start, and hang.
        await new Promise((r) => setTimeout(r, 1_000));
        await client.close();
        await database.close();
        proxy.restore();
        // It could not be given up: it lapses, as a killed replica's does.
        expect(await replicaRow(replicaId)).toBeDefined();
      } finally {
        await proxy.close();
      }
    });
  },
);
