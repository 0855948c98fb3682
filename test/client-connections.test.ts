import { once } from 'node:events';
import { connect, type AddressInfo, type Socket } from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildApp } from '../src/app.js';
import { loadVerificationKeys } from '../src/auth/jwt-keys.js';
import { CLIENT_WENT_AWAY } from '../src/http/error-handler.js';
import { TestBackend } from './helpers/backend.js';
import { startHarness, testConfig, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/**
 * What a gateway does with clients that do not finish what they send: one that hangs up mid-body
 * is logged as that, not as a database fault; and closing (SIGTERM) waits for the calls being handled, not for clients that never finish sending
 * a request: once no handler runs, the connections left (half-sent headers or bodies, idle
 * keep-alives) are closed, and the shutdown completes.
 */

const T = 'tenant-drain';
const AGENT = 'drain.agent';

let h: Harness;
let backend: TestBackend;
let port: number;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await registerTool(h.client, {
    id: 'drain.gated',
    backendUrl: `${backend.url}/gate`,
    allowed_agents: [AGENT],
    timeout_ms: 10_000,
  });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'drain.gated' });
  await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  port = (h.client.app.server.address() as AddressInfo).port;
});

afterAll(async () => {
  await backend?.close();
  await h?.db.drop();
});

async function rawConnection(text: string): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  await once(socket, 'connect');
  socket.on('error', () => undefined);
  socket.write(text);
  return socket;
}

describe('closing while clients hold connections open', () => {
  it('finishes the call in flight, then closes half-sent requests instead of waiting for them', async () => {
    const token = tokens.agent(AGENT, { tenant: T });
    const halfHeaders = await rawConnection('GET /ready HTTP/1.1\r\nhost: toolgate\r\nx-slow: ');
    const halfBody = await rawConnection(
      `POST /runs/execute HTTP/1.1\r\nhost: toolgate\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{"run_id":`,
    );
    const idle = await rawConnection('GET /health HTTP/1.1\r\nhost: toolgate\r\n\r\n');
    await once(idle, 'data');
    const runId = newRunId('drain');
    const inFlight = fetch(`http://127.0.0.1:${port}/runs/execute`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        run_id: runId,
        context: {},
        plan: [{ tool_id: 'drain.gated', input: { q: 'in flight' } }],
      }),
    });
    await backend.waitForHits('/gate', 1);

    let closed = false;
    const closing = h.client.app.close().then(() => (closed = true));
    await new Promise((resolve) => setTimeout(resolve, 200));
    // The call being handled holds the shutdown; the half-sent requests do not yet matter.
    expect(closed).toBe(false);
    backend.openGate();
    expect((await inFlight).status).toBe(200);

    const ended = await Promise.race([
      closing.then(() => 'closed'),
      new Promise((resolve) => setTimeout(() => resolve('still open'), 5_000)),
    ]);
    expect(ended).toBe('closed');
    for (const socket of [halfHeaders, halfBody, idle]) {
      if (!socket.destroyed) await once(socket, 'close');
    }
  });
});

describe('a client hanging up mid-request', () => {
  it('is logged as a client that went away, never as the database being unavailable', async () => {
    const lines: Array<Record<string, unknown>> = [];
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        for (const line of chunk.toString('utf8').split('\n'))
          if (line) lines.push(JSON.parse(line) as Record<string, unknown>);
        done();
      },
    });
    const config = testConfig();
    const app = await buildApp({
      config,
      database: h.db.database,
      keys: await loadVerificationKeys(config),
      logger: pino({ level: 'info' }, sink),
    });
    await app.listen({ port: 0, host: '127.0.0.1' });
    try {
      const token = tokens.platform();
      const port = (app.server.address() as AddressInfo).port;
      // Ended with a FIN (the parser sees the body cut short) and with a reset (the body stream aborts).
      for (const hangUp of ['destroy', 'resetAndDestroy'] as const) {
        lines.length = 0;
        const socket = connect(port, '127.0.0.1');
        await once(socket, 'connect');
        socket.on('error', () => undefined);
        socket.write(
          `POST /grants HTTP/1.1\r\nhost: toolgate\r\nauthorization: Bearer ${token}\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n{"agent_id":`,
        );
        await new Promise((resolve) => setTimeout(resolve, 200));
        socket[hangUp]();
        for (let i = 0; i < 100 && !lines.some((line) => line.msg === CLIENT_WENT_AWAY); i += 1)
          await new Promise((resolve) => setTimeout(resolve, 20));
        expect(
          lines.map((line) => line.msg),
          hangUp,
        ).not.toContain('database unavailable');
        expect(
          lines.find((line) => line.msg === CLIENT_WENT_AWAY),
          hangUp,
        ).toMatchObject({ level: 30 });
      }
    } finally {
      await app.close();
    }
  });
});
