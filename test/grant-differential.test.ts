import { EventEmitter } from 'node:events';
import { sql } from 'kysely';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { NotificationListener } from '../src/db/database.js';
import { GrantAdmission } from '../src/grants/grant-admission.js';
import { GrantSnapshot } from '../src/grants/grant-snapshot.js';
import { grantStandsAsDecided } from '../src/grants/grant-snapshot-repository.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { registerTool } from './helpers/world.js';

/*
 * A grant decided from a replica's copy (`GrantAdmission.assume`) is written as used only if SQL finds it still
 * standing as decided (`grantStandsAsDecided`): whenever SQL says so, the database's own decision must be that grant.
 * Seeded random grant changes, with the copy caught up or left behind at random.
 */
function random(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const T = 'tenant-grant-differential';
const AGENTS = ['diff.a', 'diff.b'];
const TOOLS = ['diff.one', 'diff.two'];
let h: Harness;

beforeAll(async () => {
  h = await startHarness();
  for (const tool of TOOLS)
    await registerTool(h.client, { id: tool, backendUrl: 'http://127.0.0.1:9/unused', allowed_agents: AGENTS });
});
afterAll(async () => {
  await h?.close();
});

describe('a grant decided from the copy, and SQL that finds it standing as decided', () => {
  it('never stands unless the database decides the same grant, over 200 random changes', async () => {
    const next = random(47);
    const pick = <T>(values: readonly T[]): T => values[Math.floor(next() * values.length)]!;
    const listener: NotificationListener = Object.assign(new EventEmitter(), {
      connected: true,
      subscribe: async () => undefined,
      close: async () => undefined,
    });
    const registry = new Registry();
    const snapshot = new GrantSnapshot({
      db: h.db.database.control,
      listener,
      registry,
      logger: pino({ level: 'silent' }),
      pollIntervalMs: 3_600_000,
      maxStalenessMs: 3_600_000,
      now: () => new Date(),
    });
    const grants = h.client.app.services.grants;
    const admission = new GrantAdmission(snapshot, grants, () => new Date(), registry);
    const live: string[] = [];
    const seen = { stood: 0, fell: 0 };
    await snapshot.start();
    try {
      for (let step = 0; step < 200; step += 1) {
        const change = next();
        const operator = tokens.tenantOperator(T);
        const expiresAt = () => new Date(Date.now() + 600_000 + Math.floor(next() * 600_000)).toISOString();
        if (change < 0.45 || live.length === 0) {
          const perUser = next() < 0.5;
          const created = await h.client.post('/grants', {
            token: operator,
            body: {
              agent_id: pick(AGENTS),
              tool_id: pick(TOOLS),
              scope: perUser ? 'per-user' : 'per-tenant',
              scope_ref: perUser ? pick(['u-1', 'u-2']) : T,
              capability_modifiers: {},
              expires_at: expiresAt(),
              rationale: 'the differential test',
            },
          });
          // The same grant given again is refused (409): the world is unchanged.
          expect([201, 409]).toContain(created.status);
          if (created.status === 201) live.push(created.body.id as string);
        } else if (change < 0.6) {
          const id = live.splice(Math.floor(next() * live.length), 1)[0]!;
          const revoked = await h.client.post(`/grants/${id}/revoke`, {
            token: operator,
            body: { reason: 'the differential test' },
          });
          expect(revoked.status).toBe(200);
        } else if (change < 0.75) {
          // A renewal: the same grant, a newer version of it.
          const at = Math.floor(next() * live.length);
          const renewed = await h.client.post(`/grants/${live[at]!}/renew`, {
            token: operator,
            body: { rationale: 'the differential test', expires_at: expiresAt() },
          });
          expect(renewed.status, JSON.stringify(renewed.body)).toBe(201);
          live[at] = renewed.body.id as string;
        }
        // The copy catches up only now and then, so that it decides from grants changed since.
        if (next() < 0.25) await snapshot.refresh();
        const query = {
          tenantId: T,
          agentId: pick(AGENTS),
          toolId: pick(TOOLS),
          context: { run_id: `run-${step}`, user_id: pick(['u-1', 'u-2']) },
        };
        const assumed = admission.assume(query);
        if (assumed === undefined) continue;
        const w = sql`(select ${assumed.grant.id}::text as grant_id, ${T}::text as tenant_id,
          ${assumed.assumed.agentId}::text as agent_id, ${assumed.assumed.toolId}::text as tool_id,
          ${assumed.assumed.version}::bigint as since, ${assumed.assumed.decidedAt.toISOString()}::timestamptz as decided_at)`;
        const { rows } = await sql<{
          stands: boolean;
        }>`select ${grantStandsAsDecided(sql`w`)} as stands from ${w} w`.execute(h.db.database.control);
        const exact = await grants.resolve(query);
        if (rows[0]!.stands) {
          seen.stood += 1;
          expect(exact, JSON.stringify({ step, query, assumed: assumed.grant.id })).toMatchObject({
            ok: true,
            grant: { id: assumed.grant.id },
          });
        } else seen.fell += 1;
      }
    } finally {
      await snapshot.stop();
    }
    // Both outcomes were met: the copy was right often, and behind often.
    expect(seen.stood).toBeGreaterThan(10);
    expect(seen.fell).toBeGreaterThan(3);
  });
});
