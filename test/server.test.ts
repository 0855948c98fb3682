import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { createEmptyDatabaseUrl, hasPostgresServer } from './helpers/database.js';
import { freePort } from './helpers/net.js';
import { until } from './helpers/waits.js';

const root = new URL('..', import.meta.url).pathname;
const tsx = join(root, 'node_modules', '.bin', 'tsx');

/** The environment of a fresh machine: no DATABASE_URL, no JWT key, only what we pass. */
function bareEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH, HOME: process.env.HOME, ...extra };
}

/**
 * A database for one gateway process: a new one on the test server, or none on embedded PGlite
 * (the process then opens its own in its TOOLGATE_DATA_DIR). What it needs is a database, not a server.
 */
async function processDatabase(): Promise<{ env: Record<string, string>; drop(): Promise<void> }> {
  if (!hasPostgresServer) return { env: {}, drop: async () => undefined };
  const db = await createEmptyDatabaseUrl();
  return { env: { DATABASE_URL: db.url }, drop: db.drop };
}

const children: ChildProcess[] = [];
afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
});

describe('npm start on a fresh machine', () => {
  it('serves /health and /ready on the embedded database, prints a working operator token, and stops cleanly', async () => {
    const port = await freePort();
    const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-start-'));
    const child = spawn(tsx, ['src/server.ts'], {
      cwd: root,
      env: bareEnv({ PORT: String(port), TOOLGATE_DATA_DIR: dataDir }),
    });
    children.push(child);
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));

    await until(
      'the server to answer',
      () =>
        fetch(`http://127.0.0.1:${port}/health`).then(
          () => true,
          () => false,
        ),
      { timeoutMs: 150_000, intervalMs: 200 },
    );
    const health = await fetch(`http://127.0.0.1:${port}/health`);
    expect(health.status).toBe(200);
    const ready = await fetch(`http://127.0.0.1:${port}/ready`);
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready', database: 'pglite' });

    for (let i = 0; i < 50 && !stderr.includes('TOOLGATE_TOKEN='); i += 1) await new Promise((r) => setTimeout(r, 100));
    const token = /TOOLGATE_TOKEN=(\S+)/.exec(stderr)?.[1];
    expect(token).toBeDefined();
    const whoami = await fetch(`http://127.0.0.1:${port}/whoami`, { headers: { authorization: `Bearer ${token}` } });
    expect(await whoami.json()).toMatchObject({ kind: 'operator', role: 'platform-operator' });

    // The token minter signs with the same development secret.
    const minted = spawnSync(tsx, ['src/cli/token.ts', '--kind', 'agent', '--sub', 'x.agent', '--tenant', 'dev'], {
      cwd: root,
      env: bareEnv({ TOOLGATE_DATA_DIR: dataDir }),
      encoding: 'utf8',
    });
    expect(minted.status).toBe(0);
    const agent = await fetch(`http://127.0.0.1:${port}/whoami`, {
      headers: { authorization: `Bearer ${minted.stdout.trim()}` },
    });
    expect(await agent.json()).toMatchObject({ kind: 'agent', id: 'x.agent' });

    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  }, 180_000);

  it('stops when its npm start process gets SIGTERM, and prints the port it really listens on', async () => {
    // Supervisors often signal the process they started: npm, not node beneath it.
    const db = await processDatabase();
    const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-npm-start-'));
    // In a process group of its own, so that whatever it leaves behind can be cleaned up.
    const child = spawn('npm', ['start'], {
      cwd: root,
      detached: true,
      env: bareEnv({ PORT: '0', ...db.env, TOOLGATE_DATA_DIR: dataDir, LOG_LEVEL: 'warn' }),
    });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<void>((resolve) => child.on('exit', () => resolve()));
    try {
      for (let i = 0; i < 600 && !/127\.0\.0\.1:\d+\/whoami/.test(stderr); i += 1)
        await new Promise((r) => setTimeout(r, 100));
      const port = Number(/127\.0\.0\.1:(\d+)\/whoami/.exec(stderr)?.[1]);
      expect(port).toBeGreaterThan(0);
      expect((await fetch(`http://127.0.0.1:${port}/health`)).status).toBe(200);
      child.kill('SIGTERM');
      await exited;
      let refused = false;
      for (let i = 0; i < 100 && !refused; i += 1) {
        refused = await fetch(`http://127.0.0.1:${port}/health`).then(
          () => false,
          () => true,
        );
        if (!refused) await new Promise((r) => setTimeout(r, 100));
      }
      expect(refused).toBe(true);
    } finally {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        // the group is gone already
      }
      await db.drop();
    }
  }, 120_000);

  it('takes the same signal again within a second as one request to shut down (npm forwards node a copy of its group\'s signal); later, as "exit now"', async () => {
    // Ctrl-C in a terminal, `kill -- -PGID` and systemd signal every process of the group: node
    // gets the signal, and `npm start` forwards it the same signal again.
    const db = await processDatabase();
    /** A gateway process (node itself, no launcher that forwards signals) with a request in flight, its body still arriving. */
    const startHeld = async () => {
      const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-signals-'));
      const child = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
        cwd: root,
        env: bareEnv({ PORT: '0', ...db.env, TOOLGATE_DATA_DIR: dataDir, LOG_LEVEL: 'info' }),
      });
      children.push(child);
      let output = '';
      child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
      for (let i = 0; i < 600 && !/127\.0\.0\.1:\d+\/whoami/.test(output); i += 1)
        await new Promise((r) => setTimeout(r, 100));
      const port = Number(/127\.0\.0\.1:(\d+)\/whoami/.exec(output)?.[1]);
      expect(port).toBeGreaterThan(0);
      const socket = connect(port, '127.0.0.1');
      let answer = '';
      socket.on('data', (chunk: Buffer) => (answer += chunk.toString()));
      socket.on('error', () => undefined);
      const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
      await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
      const token = /TOOLGATE_TOKEN=(\S+)/.exec(output)?.[1];
      expect(token).toBeDefined();
      // Authenticated, so that it waits for its body (an unauthenticated one is answered at once).
      const body = JSON.stringify({ scope: 'tenant', period: 'day', limit_units: 'not a number' });
      socket.write(
        `POST /budgets HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body.slice(0, 5)}`,
      );
      // The headers are read: the request is in flight, and holds the graceful close open.
      await new Promise((r) => setTimeout(r, 300));
      const shuttingDown = async () => {
        for (let i = 0; i < 200 && !output.includes('"shutting down"'); i += 1)
          await new Promise((r) => setTimeout(r, 25));
        expect(output).toContain('"shutting down"');
      };
      return {
        child,
        exited,
        shuttingDown,
        finish: () => socket.end(body.slice(5)),
        answered: closed.then(() => answer),
        output: () => output,
      };
    };
    try {
      const twice = await startHeld();
      twice.child.kill('SIGTERM');
      await twice.shuttingDown();
      twice.child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 200));
      twice.finish();
      // Answered (its body is refused: 400), then a clean exit: the copy did not cut the request off.
      expect(await twice.answered).toMatch(/^HTTP\/1\.1 400 /);
      expect(await twice.exited).toBe(0);

      const later = await startHeld();
      later.child.kill('SIGTERM');
      await later.shuttingDown();
      await new Promise((r) => setTimeout(r, 1_200));
      later.child.kill('SIGTERM');
      // A second signal well after the first still means "exit now".
      expect(await later.exited).toBe(1);
      expect(await later.answered).toBe('');
      expect(later.output()).toContain('exiting now');
    } finally {
      await db.drop();
    }
  }, 120_000);

  it('stops at start-up on a bad variable, naming it', { timeout: 60_000 }, () => {
    const result = spawnSync(tsx, ['src/server.ts'], { cwd: root, env: bareEnv({ PORT: 'eighty' }), encoding: 'utf8' });
    expect(result.status).toBe(2);
    expect(result.stderr).toContain('PORT');
  });

  it(
    'stops at start-up on a public key no token could be verified with, naming the variable, before touching a database',
    { timeout: 60_000 },
    () => {
      const p384 = generateKeyPairSync('ec', { namedCurve: 'secp384r1' })
        .publicKey.export({ type: 'spki', format: 'pem' })
        .toString();
      for (const key of [p384, '-----BEGIN PUBLIC KEY-----\ngarbage\n-----END PUBLIC KEY-----']) {
        // An unreachable database: the key is refused before it would be tried.
        const result = spawnSync(tsx, ['src/server.ts'], {
          cwd: root,
          env: bareEnv({ TOOLGATE_JWT_PUBLIC_KEY: key, DATABASE_URL: 'postgres://nobody@127.0.0.1:1/none' }),
          encoding: 'utf8',
        });
        expect(result.status).not.toBe(0);
        expect(result.stderr).toContain('TOOLGATE_JWT_PUBLIC_KEY');
        expect(result.stderr).not.toContain('ECONNREFUSED');
      }
    },
  );

  it('has a token minter that answers a bad flag with its usage, not a stack trace', { timeout: 60_000 }, () => {
    for (const args of [['--bogus'], ['--kind', 'agent', '--tenant', 't1', '--role', 'platform-operator']]) {
      const result = spawnSync(tsx, ['src/cli/token.ts', ...args], {
        cwd: root,
        env: bareEnv({ TOOLGATE_JWT_SECRET: 'x'.repeat(40) }),
        encoding: 'utf8',
      });
      expect(result.status).toBe(2);
      expect(result.stderr).toContain('usage: npm run token');
      expect(result.stderr).not.toMatch(/TypeError|at .*\.ts:\d+/);
    }
  });

  it('has a token minter that refuses to run without a development secret', { timeout: 60_000 }, () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-nosecret-'));
    const result = spawnSync(
      tsx,
      ['src/cli/token.ts', '--kind', 'operator', '--role', 'platform-operator', '--tenant', 't1'],
      {
        cwd: root,
        env: bareEnv({ TOOLGATE_DATA_DIR: dataDir }),
        encoding: 'utf8',
      },
    );
    expect(result.status).toBe(2);
    expect(result.stderr).toContain('no development secret');
  });
});
