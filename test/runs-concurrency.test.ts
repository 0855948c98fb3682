import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { deleteFinishedRunTrees } from '../src/retention/retention-repository.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { startHarness, type Harness, type TestResponse } from './helpers/harness.js';
import { execute } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';
import { lockWaits, until } from './helpers/waits.js';

// POST /runs/execute under concurrency: claims, grant uses and run ends of calls arriving
// together share statements (group commit). Sharing must not let a run id execute twice, nor
// lose or mix up any run's records.
const T = 'tenant-runs-concurrency';
const AGENT = 'veritas.concurrent';
const agent = tokens.agent(AGENT, { tenant: T, family: 'veritas', scope: 'scf:read' });

let h: Harness;
let backend: TestBackend;
let echoGrant: string;

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await registerTool(h.client, { id: 'echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
  await registerTool(h.client, { id: 'gated', backendUrl: `${backend.url}/gate`, allowed_agents: [AGENT] });
  echoGrant = (await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'echo' })).id;
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'gated' });
});
afterAll(async () => {
  backend?.openGate();
  await backend?.close();
  await h?.close();
});

const hitsOf = (runId: string) => backend.hitsOfRun(runId);

async function auditTypes(runIds: string[]): Promise<Map<string, string[]>> {
  const rows = await h.db.database.control
    .selectFrom('audit_events')
    .select(['run_id', 'event_type'])
    .where('tenant_id', '=', T)
    .where('run_id', 'in', runIds)
    .orderBy('seq')
    .execute();
  const types = new Map<string, string[]>(runIds.map((id) => [id, []]));
  for (const row of rows) types.get(row.run_id!)!.push(row.event_type);
  return types;
}

function isConflict(res: TestResponse): boolean {
  return res.status === 409 && res.body.error?.code === 'run_id_conflict';
}

/** A run's records: its one call's intent and outcome, and one `run.rejected` for each copy refused with 409. */
function expectOneCallAndRefusals(types: string[] | undefined, refusals: number): void {
  expect(types?.filter((type) => type !== 'run.rejected')).toEqual(['run.step.dispatching', 'run.step.completed']);
  expect(types?.filter((type) => type === 'run.rejected')).toHaveLength(refusals);
}

/**
 * Of the answers to copies of one request, exactly one ran the run (200, not replayed); every
 * other one is a 409 run_id_conflict or a replay of that very envelope. Returns the one that ran.
 */
function theOneThatRan(answers: TestResponse[]): TestResponse {
  const ran = answers.filter((res) => res.status === 200 && res.headers['x-toolgate-replayed'] === undefined);
  expect(ran).toHaveLength(1);
  const winner = ran[0]!;
  for (const res of answers) {
    if (res === winner) continue;
    if (res.status === 200) {
      expect(res.headers['x-toolgate-replayed']).toBe('true');
      expect(res.body).toEqual(winner.body);
    } else {
      expect(isConflict(res), res.text).toBe(true);
    }
  }
  return winner;
}

describe('one run id sent many times at once', () => {
  it('executes once: one answer runs it, the others are refused or replay its envelope', async () => {
    const runId = newRunId('same');
    const body = { run_id: runId, plan: [{ tool_id: 'echo', input: { q: 'only once' } }] };
    const answers = await Promise.all(Array.from({ length: 10 }, () => execute(h.client, agent, body)));

    expect(hitsOf(runId)).toHaveLength(1);
    const winner = theOneThatRan(answers);
    expect(winner.body).toMatchObject({
      run_id: runId,
      status: 'completed',
      steps: [{ status: 'completed', output: { echo: { q: 'only once' } } }],
    });
    expectOneCallAndRefusals((await auditTypes([runId])).get(runId), answers.filter(isConflict).length);
  });

  it('refuses every copy that arrives while the first is still executing, and replays after', async () => {
    const runId = newRunId('gated');
    const body = { run_id: runId, plan: [{ tool_id: 'gated', input: { q: 'held' } }] };
    const gateHits = backend.hitsOn('/gate').length;
    const answered: TestResponse[] = [];
    const pending = Array.from({ length: 10 }, () =>
      execute(h.client, agent, body).then((res) => {
        answered.push(res);
        return res;
      }),
    );
    await backend.waitForHits('/gate', gateHits + 1);
    // Every copy but the one at the backend is answered while it is held there.
    await until('every copy but the held one to be answered', () => answered.length >= 9);
    const refused = [...answered];
    expect(refused).toHaveLength(9);
    for (const res of refused) expect(isConflict(res), res.text).toBe(true);
    expect(refused.map((res) => res.body.error.details)).toEqual(
      Array.from({ length: 9 }, () => ({ status: 'running' })),
    );

    backend.openGate();
    const all = await Promise.all(pending);
    const winner = all.find((res) => !refused.includes(res))!;
    expect(winner.status).toBe(200);
    expect(winner.body).toMatchObject({ run_id: runId, status: 'completed' });
    expect(backend.hitsOn('/gate')).toHaveLength(gateHits + 1);

    const again = await execute(h.client, agent, body);
    expect(again.headers['x-toolgate-replayed']).toBe('true');
    expect(again.body).toEqual(winner.body);
    expect(hitsOf(runId)).toHaveLength(1);
    // Each copy refused is on record; the replay is not a refusal.
    expectOneCallAndRefusals((await auditTypes([runId])).get(runId), 9);
  });

  it('executes each of several ids once when every id is sent several times in one burst', async () => {
    const runIds = Array.from({ length: 6 }, () => newRunId('burst'));
    const bodies = runIds.flatMap((runId) =>
      Array.from({ length: 4 }, () => ({ run_id: runId, plan: [{ tool_id: 'echo', input: { q: runId } }] })),
    );
    // Interleaved, so that copies of one id are never next to each other in a batch.
    const order = bodies.map((_, i) => bodies[(i % 6) * 4 + Math.floor(i / 6)]!);
    const answers = await Promise.all(order.map((body) => execute(h.client, agent, body)));
    const types = await auditTypes(runIds);
    for (const runId of runIds) {
      expect(hitsOf(runId)).toHaveLength(1);
      const copies = answers.filter((_, i) => order[i]!.run_id === runId);
      const winner = theOneThatRan(copies);
      expect(winner.body).toMatchObject({ run_id: runId, status: 'completed' });
      expect(winner.body.steps[0].output).toEqual({ echo: { q: runId } });
      expectOneCallAndRefusals(types.get(runId), copies.filter(isConflict).length);
    }
  });
});

describe('many distinct runs at once', () => {
  it('all complete, each with its own intent and outcome record, grant use and stored end', async () => {
    const runIds = Array.from({ length: 25 }, () => newRunId('distinct'));
    const answers = await Promise.all(
      runIds.map((runId) =>
        execute(h.client, agent, {
          run_id: runId,
          plan: [
            { tool_id: 'echo', input: { q: runId } },
            { tool_id: 'echo', input: { q: `${runId}/2` } },
          ],
        }),
      ),
    );
    for (const [i, res] of answers.entries()) {
      expect(res.status, res.text).toBe(200);
      expect(res.headers['x-toolgate-replayed']).toBeUndefined();
      expect(res.body).toMatchObject({
        run_id: runIds[i],
        status: 'completed',
        steps: [
          { status: 'completed', output: { echo: { q: runIds[i] } } },
          { status: 'completed', output: { echo: { q: `${runIds[i]}/2` } } },
        ],
      });
    }
    const types = await auditTypes(runIds);
    for (const runId of runIds) {
      expect(hitsOf(runId).map((hit) => hit.body)).toEqual([{ q: runId }, { q: `${runId}/2` }]);
      expect(types.get(runId)).toEqual([
        'run.step.dispatching',
        'run.step.completed',
        'run.step.dispatching',
        'run.step.completed',
      ]);
    }

    const db = h.db.database.control;
    const runs = await db
      .selectFrom('runs')
      .select(['run_id', 'status', 'busy', 'http_status', 'envelope'])
      .where('tenant_id', '=', T)
      .where('run_id', 'in', runIds)
      .execute();
    expect(runs).toHaveLength(25);
    for (const run of runs) {
      expect(run).toMatchObject({ status: 'completed', busy: false, http_status: 200 });
      expect(run.envelope).toEqual(answers[runIds.indexOf(run.run_id)]!.body);
    }
    const uses = await db
      .selectFrom('run_grant_uses')
      .select(['run_id', 'grant_id'])
      .where('tenant_id', '=', T)
      .where('run_id', 'in', runIds)
      .execute();
    expect(uses.map((u) => u.run_id).sort()).toEqual([...runIds].sort());
    for (const use of uses) expect(use.grant_id).toBe(echoGrant);
  });

  it('fails only the run whose value PostgreSQL refuses when it shares a batch with others', async () => {
    // A NUL byte cannot be stored (class 22): the batch it lands in is committed one by one.
    const ids = Array.from({ length: 12 }, () => newRunId('nul'));
    const bad = 6;
    const answers = await Promise.all(
      ids.map((run_id, i) =>
        execute(h.client, agent, {
          run_id,
          plan: [{ tool_id: 'echo', input: { q: i === bad ? 'a\u0000b' : `ok-${i}` } }],
        }),
      ),
    );
    answers.forEach((res, i) => {
      if (i === bad) {
        expect(res.status).toBe(400);
        expect(res.body.error.code).toBe('invalid_request');
      } else {
        expect(res.status).toBe(200);
        expect(res.body.status).toBe('completed');
      }
    });
    expect(hitsOf(ids[bad]!)).toHaveLength(0);
    const types = await auditTypes(ids);
    ids.forEach((id, i) =>
      expect(types.get(id)).toEqual(i === bad ? [] : ['run.step.dispatching', 'run.step.completed']),
    );
  });
});

describe.skipIf(!hasPostgresServer)('a run id deleted while it is being claimed (needs a PostgreSQL server)', () => {
  it('is claimed again and runs, instead of failing the request', async () => {
    const db = h.db.database.control;
    const runId = newRunId('swept');
    const body = { run_id: runId, plan: [{ tool_id: 'echo', input: { q: 'again' } }] };
    const first = await execute(h.client, agent, body);
    expect(first.status).toBe(200);

    // Another session changing the run (uncommitted) makes the claim wait for it, then find the id taken.
    const holder = new pg.Client({ connectionString: h.db.url });
    await holder.connect();
    try {
      await holder.query('begin');
      await holder.query('update runs set updated_at = updated_at where tenant_id = $1 and run_id = $2', [T, runId]);
      const again = execute(h.client, agent, body);
      await until('the claim to wait for the run', async () => (await lockWaits(db, '%insert into runs%')) === 1);
      // The retention sweep queues for the table behind the claim, and deletes the run once the
      // claim has found it taken, before the executor reads it.
      const sweep = db.transaction().execute(async (trx) => {
        await sql`lock table runs in access exclusive mode`.execute(trx);
        return deleteFinishedRunTrees(
          trx,
          [{ updated_at_text: '', tenant_id: T, run_id: runId }],
          new Date(Date.now() + 86_400_000),
          new Date(),
        );
      });
      await until('the sweep to wait for the table', async () => (await lockWaits(db, 'lock table runs%')) === 1);
      await holder.query('commit');
      expect((await sweep).runs).toBe(1);

      const res = await again;
      expect(res.status, res.text).toBe(200);
      expect(res.headers['x-toolgate-replayed']).toBeUndefined();
      expect(res.body).toMatchObject({ run_id: runId, status: 'completed' });
      expect(hitsOf(runId)).toHaveLength(2);
    } finally {
      await holder.end();
    }
  });

  it('answers 409 on record when the id vanishes again, at the second claim too', async () => {
    const db = h.db.database.control;
    const runId = newRunId('vanishing');
    // What the executor sees when the id is taken at each claim and deleted before each read: the
    // claim inserts nothing, the read finds nothing. Made with a trigger on this run id alone.
    await sql`create function test_vanishing_claim() returns trigger language plpgsql as $$ begin return null; end $$`.execute(
      db,
    );
    await sql`create trigger test_vanishing_claim before insert on runs for each row when (new.run_id = ${sql.lit(runId)}) execute function test_vanishing_claim()`.execute(
      db,
    );
    try {
      const res = await execute(h.client, agent, { run_id: runId, plan: [{ tool_id: 'echo', input: { q: 'never' } }] });
      expect(res.status, res.text).toBe(409);
      expect(res.body.error).toMatchObject({ code: 'run_id_conflict', details: {} });
      expect(hitsOf(runId)).toEqual([]);
      const refused = await h.client.get('/audit', { token: tokens.tenantOperator(T), query: { run_id: runId } });
      expect(refused.body.items).toEqual([
        expect.objectContaining({
          event_type: 'run.rejected',
          actor: `agent:${AGENT}`,
          status: 'denied',
          reason_code: 'run_id_conflict',
          details: { message: res.body.error.message },
        }),
      ]);
    } finally {
      await sql`drop trigger test_vanishing_claim on runs`.execute(db);
      await sql`drop function test_vanishing_claim()`.execute(db);
    }
  });
});
