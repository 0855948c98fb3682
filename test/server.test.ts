import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from './helpers/net.js';

const root = new URL('..', import.meta.url).pathname;
const tsx = join(root, 'node_modules', '.bin', 'tsx');

/** The environment of a fresh machine: no DATABASE_URL, no JWT key, only what we pass. */
function bareEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH, HOME: process.env.HOME, ...extra };
}

async function waitFor(url: string, timeoutMs: number): Promise<Response> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await fetch(url);
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((r) => setTimeout(r, 200));
    }
  }
}

const children: ChildProcess[] = [];
afterAll(() => {
  for (const child of children) child.kill('SIGKILL');
});

describe('npm start on a fresh machine', () => {
  it('serves /health and /ready on the embedded database, prints a working operator token, and stops cleanly', async () => {
    const port = await freePort();
    const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-start-'));
    const child = spawn(tsx, ['src/server.ts'], { cwd: root, env: bareEnv({ PORT: String(port), TOOLGATE_DATA_DIR: dataDir }) });
    children.push(child);
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));

    const health = await waitFor(`http://127.0.0.1:${port}/health`, 150_000);
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
    const agent = await fetch(`http://127.0.0.1:${port}/whoami`, { headers: { authorization: `Bearer ${minted.stdout.trim()}` } });
    expect(await agent.json()).toMatchObject({ kind: 'agent', id: 'x.agent' });

    child.kill('SIGTERM');
    expect(await exited).toBe(0);
  }, 180_000);

  it('stops at start-up on a bad variable, naming it', { timeout: 60_000 }, () => {
    const result = spawnSync(tsx, ['src/server.ts'], { cwd: root, env: bareEnv({ PORT: 'eighty' }), encoding: 'utf8' });
    expect(result.status).toBe(2);
    expect(result.stderr).toContain('PORT');
  });

  it('has a token minter that refuses to run without a development secret', { timeout: 60_000 }, () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-nosecret-'));
    const result = spawnSync(tsx, ['src/cli/token.ts', '--kind', 'operator', '--role', 'platform-operator', '--tenant', 't1'], {
      cwd: root,
      env: bareEnv({ TOOLGATE_DATA_DIR: dataDir }),
      encoding: 'utf8',
    });
    expect(result.status).toBe(2);
    expect(result.stderr).toContain('no development secret');
  });
});
