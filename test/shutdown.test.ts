import { once } from 'node:events';
import { connect, type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

// A rolling deploy stops replicas with SIGTERM, which closes the app (src/server.ts): a call in
// flight at that moment must finish — answered, audited, its run ended — not be left busy.
const T = 'tenant-shutdown';
const AGENT = 'shutdown.agent';
const agent = tokens.agent(AGENT, { tenant: T, family: 'shutdown' });

let h: Harness;
let backend: TestBackend;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await registerTool(h.client, { id: 'gated', backendUrl: `${backend.url}/gate`, allowed_agents: [AGENT], timeout_ms: 10_000 });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'gated' });
});

afterAll(async () => {
  await backend?.close();
  await h?.db.drop();
});

/** Whether connecting to `url` fails (nobody listening) within `ms`. */
async function refusedWithin(ms: number, url: string): Promise<boolean> {
  for (const deadline = Date.now() + ms; Date.now() < deadline; ) {
    try {
      await fetch(url);
    } catch {
      return true;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  return false;
}

describe('closing the app (SIGTERM)', () => {
  it('lets a call in flight finish (answered, audited, its run ended), refuses what arrives meanwhile, and is not held open by keep-alive', async () => {
    const app = h.client.app;
    await app.listen({ port: 0, host: '127.0.0.1' });
    const port = (app.server.address() as AddressInfo).port;
    const base = `http://127.0.0.1:${port}`;
    const runId = newRunId('draining');
    // A request whose headers are still arriving when closing begins (a raw connection).
    const late = connect(port, '127.0.0.1');
    await once(late, 'connect');
    late.write('GET /ready HTTP/1.1\r\nhost: toolgate\r\n');
    const inFlight = fetch(`${base}/runs/execute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${agent}`, 'content-type': 'application/json' },
      body: JSON.stringify({ run_id: runId, context: {}, plan: [{ tool_id: 'gated', input: { q: 'in flight' } }] }),
    });
    for (let i = 0; i < 200 && !backend.hits.some((hit) => hit.headers['x-toolgate-run-id'] === runId); i += 1) await new Promise((r) => setTimeout(r, 10));
    expect(backend.hits.filter((hit) => hit.headers['x-toolgate-run-id'] === runId)).toHaveLength(1);

    let closed = false;
    const closing = app.close().then(() => {
      closed = true;
    });
    // Closing stops listening: a new connection finds nobody, while the call is still in flight.
    expect(await refusedWithin(2_000, `${base}/health`)).toBe(true);
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
    expect(JSON.parse(body!)).toEqual({ error: { code: 'gateway_unavailable', message: 'the gateway is shutting down', details: {} } });
    backend.openGate();
    const answer = await inFlight;
    expect(answer.status).toBe(200);
    const envelope = (await answer.json()) as { status: string; steps: Array<{ status: string; output: unknown; audit_id: string }> };
    expect(envelope.status).toBe('completed');
    expect(envelope.steps[0]).toMatchObject({ status: 'completed', output: { echo: { q: 'in flight' } } });
    // The answer closed its connection: nothing holds the server open until a keep-alive timeout.
    await Promise.race([closing, new Promise((r) => setTimeout(r, 5_000))]);
    expect(closed).toBe(true);

    const db = h.db.database.db;
    const run = await db.selectFrom('runs').select(['status', 'busy']).where('tenant_id', '=', T).where('run_id', '=', runId).executeTakeFirstOrThrow();
    expect(run).toEqual({ status: 'completed', busy: false });
    const events = await db.selectFrom('audit_events').select(['event_type', 'event_id']).where('run_id', '=', runId).orderBy('seq').execute();
    expect(events.map((e) => e.event_type)).toEqual(['run.step.dispatching', 'run.step.completed']);
    expect(events[1]!.event_id).toBe(envelope.steps[0]!.audit_id);
  });
});
