/**
 * `npm run bench:kill-switch`: how fast an armed or disarmed kill switch reaches other replicas.
 *
 * Starts three gateway processes on one fresh PostgreSQL database. Through the first it arms
 * and disarms a tool switch many times; on each of the other two, a poller asks
 * `GET /kill-switches/decide` (1 ms apart) and notes when the answer changes. Two clocks start
 * each measurement:
 * - **since commit**: the benchmark LISTENs on the gateway's channel itself, so it learns when
 *   PostgreSQL committed (and announced) the change. This is propagation proper: the headline.
 * - **since sent**: from sending the arm/disarm request, so it also counts that request's
 *   transaction and audit write — an upper bound.
 * Both end at the first poll answer showing the change, so both include one poll round trip.
 * Prints p50/p99/max against the SPEC §4 target (p99 ≤ 50 ms, hard bound 5 s; issue 4 asks
 * max ≤ 1 s).
 *
 * Environment: DATABASE_URL (a server where databases can be created; default the local one),
 * BENCH_TRANSITIONS (arm+disarm pairs, default 200).
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createBenchDatabase, startGateway } from './gateway-process.js';
import pg from 'pg';
import { Pool } from 'undici';
import { signDevelopmentToken } from '../src/auth/dev-token.js';

const serverUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const pairs = Number(process.env.BENCH_TRANSITIONS ?? 200);
const secret = randomBytes(32).toString('base64url');
const tenant = 'bench';
const target = 'bench.switched';
const TIMEOUT_MS = 5_000;
const POLL_PAUSE_MS = 1;

function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;
}

interface Sample {
  transition: 'arm' | 'disarm';
  observer: number;
  /** From PostgreSQL announcing the committed change to the first poll answer that shows it. */
  sinceCommitMs: number;
  /** From sending the change to the same poll answer. */
  sinceSentMs: number;
}

/** Hands out the arrival time of each notification on the kill-switch channel, in order. */
class CommitClock {
  private readonly arrived: number[] = [];
  private readonly waiting: Array<(at: number) => void> = [];

  constructor(private readonly client: pg.Client) {
    client.on('notification', () => {
      const at = performance.now();
      const waiter = this.waiting.shift();
      if (waiter) waiter(at);
      else this.arrived.push(at);
    });
  }

  async start(): Promise<void> {
    await this.client.connect();
    await this.client.query('LISTEN toolgate_kill_switches');
  }

  next(): Promise<number> {
    const at = this.arrived.shift();
    return at !== undefined ? Promise.resolve(at) : new Promise((resolve) => this.waiting.push(resolve));
  }
}

async function main(): Promise<void> {
  const database = await createBenchDatabase(serverUrl);
  const dbUrl = database.url;
  const gateways: ChildProcess[] = [];
  const pools: Pool[] = [];
  const listener = new pg.Client({ connectionString: dbUrl });
  try {
    const basePort = 19000 + Math.floor(Math.random() * 1000);
    // The first start applies the migrations; the other two then start side by side.
    gateways.push(
      await startGateway({ databaseUrl: dbUrl, port: basePort, secret, env: { TOOLGATE_DB_POOL_SIZE: '5' } }),
    );
    gateways.push(
      ...(await Promise.all(
        [1, 2].map((i) =>
          startGateway({ databaseUrl: dbUrl, port: basePort + i, secret, env: { TOOLGATE_DB_POOL_SIZE: '5' } }),
        ),
      )),
    );
    for (let i = 0; i < 3; i += 1) pools.push(new Pool(`http://127.0.0.1:${basePort + i}`, { connections: 4 }));
    const [changer, ...observers] = pools as [Pool, Pool, Pool];

    const token = signDevelopmentToken(secret, {
      kind: 'operator',
      sub: 'bench.ops',
      tenantId: tenant,
      role: 'platform-operator',
      ttlSeconds: 3600,
    });
    const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };

    const decide = async (pool: Pool): Promise<boolean> => {
      const res = await pool.request({
        path: `/kill-switches/decide?tenant_id=${tenant}&tool_id=${target}`,
        method: 'GET',
        headers,
      });
      const body = (await res.body.json()) as { ok?: boolean };
      if (res.statusCode !== 200) throw new Error(`decide answered ${res.statusCode}: ${JSON.stringify(body)}`);
      return body.ok === true;
    };
    const change = async (path: string, body: unknown): Promise<{ id: string }> => {
      const res = await changer.request({ path, method: 'POST', headers, body: JSON.stringify(body) });
      const parsed = (await res.body.json()) as { id: string };
      if (res.statusCode >= 300) throw new Error(`${path} answered ${res.statusCode}: ${JSON.stringify(parsed)}`);
      return parsed;
    };
    /** Polls one observer until its decision is `allowed`; resolves with when that answer arrived. */
    const waitFor = async (pool: Pool, allowed: boolean, deadline: number): Promise<number> => {
      for (;;) {
        if ((await decide(pool)) === allowed) return performance.now();
        if (performance.now() > deadline)
          throw new Error(`observer still ${allowed ? 'denying' : 'allowing'} after ${TIMEOUT_MS} ms`);
        // A breath between polls: back-to-back polling would starve the replicas (and the
        // database) of CPU on a small machine and measure the benchmark rather than the gateway.
        await new Promise((r) => setTimeout(r, POLL_PAUSE_MS));
      }
    };

    for (let i = 0; i < 50; i += 1) await Promise.all(pools.map(decide));
    const commits = new CommitClock(listener);
    await commits.start();

    const samples: Sample[] = [];
    const changeLatencies: number[] = [];
    const measure = async (transition: 'arm' | 'disarm', send: () => Promise<unknown>) => {
      const allowed = transition === 'disarm';
      const committed = commits.next();
      const sent = performance.now();
      // The pollers start before the change is sent, so no flip can slip by unobserved.
      const seen = observers.map((pool) => waitFor(pool, allowed, sent + TIMEOUT_MS));
      await send();
      changeLatencies.push(performance.now() - sent);
      const [at, commitAt] = await Promise.all([Promise.all(seen), committed]);
      at.forEach((t, observer) =>
        samples.push({ transition, observer: observer + 1, sinceCommitMs: t - commitAt, sinceSentMs: t - sent }),
      );
    };

    for (let i = 0; i < pairs; i += 1) {
      let id = '';
      await measure('arm', async () => {
        ({ id } = await change('/kill-switches', {
          scope: 'tool',
          target,
          tenant_id: tenant,
          reason: `bench ${i}`,
          user_visible_status_copy: 'paused by the benchmark',
        }));
      });
      await measure('disarm', () => change(`/kill-switches/${id}/disarm`, { reason: `bench ${i}` }));
    }

    const fmt = (n: number) => n.toFixed(2);
    const line = (label: string, values: number[]) => {
      const sorted = [...values].sort((a, b) => a - b);
      console.log(
        `${label.padEnd(40)} n=${String(sorted.length).padStart(4)}  p50 ${fmt(percentile(sorted, 50)).padStart(7)} ms  p99 ${fmt(percentile(sorted, 99)).padStart(7)} ms  max ${fmt(sorted[sorted.length - 1]!).padStart(7)} ms`,
      );
      return sorted;
    };
    console.log(
      `\nkill-switch propagation: 3 gateway processes, ${pairs} arm/disarm pairs through #0, observed on #1 and #2\n`,
    );
    const all = line(
      'since commit (propagation)',
      samples.map((s) => s.sinceCommitMs),
    );
    line(
      '  arm',
      samples.filter((s) => s.transition === 'arm').map((s) => s.sinceCommitMs),
    );
    line(
      '  disarm',
      samples.filter((s) => s.transition === 'disarm').map((s) => s.sinceCommitMs),
    );
    for (const observer of [1, 2])
      line(
        `  on replica #${observer}`,
        samples.filter((s) => s.observer === observer).map((s) => s.sinceCommitMs),
      );
    const upper = line(
      'since sent (upper bound)',
      samples.map((s) => s.sinceSentMs),
    );
    line('arm/disarm request on #0 (for scale)', changeLatencies);
    const verdict = (sorted: number[]) => {
      const p99 = percentile(sorted, 99);
      const max = sorted[sorted.length - 1]!;
      return `p99 <= 50 ms ${p99 <= 50 ? 'met' : 'MISSED'}, max <= 1 s ${max <= 1000 ? 'met' : 'MISSED'}`;
    };
    console.log(`\nsince commit: ${verdict(all)}; since sent: ${verdict(upper)}`);
    if (percentile(all, 99) > 50 || all[all.length - 1]! > 1000) process.exitCode = 1;
  } finally {
    await listener.end().catch(() => undefined);
    for (const pool of pools) await pool.close().catch(() => undefined);
    for (const g of gateways) g.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 500));
    await database.drop();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
