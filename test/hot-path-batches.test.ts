import { sql, type Kysely } from 'kysely';
import pg from 'pg';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCounterKey } from '../src/budgets/budget.js';
import { BudgetLedger } from '../src/budgets/budget-ledger.js';
import { settlementOf, type BudgetReservation, type ReserveResult } from '../src/budgets/budget-reservation.js';
import { counterId, readCounters, type CounterRef } from '../src/budgets/budget-counter-repository.js';
import { writeLedgerIf } from '../src/budgets/budget-ledger-repository.js';
import { closeAndUncharge } from '../src/budgets/reservation-close-repository.js';
import { periodStart } from '../src/budgets/budget-period.js';
import { createBudget, getBudget } from '../src/budgets/budget-service.js';
import type { DB } from '../src/db/schema.js';
import type { Grant, GrantScope } from '../src/grants/grant.js';
import { findGrantCandidates, insertGrant, revokeGrant } from '../src/grants/grant-repository.js';
import {
  claimRuns,
  type ClaimedRunStart,
  type ClaimedRunStartAnswer,
  type EndedRunStart,
  type NewRun,
} from '../src/runs/run-claim-repository.js';
import { endRuns, type RunEnding } from '../src/runs/run-end-repository.js';
import { findRun } from '../src/runs/run-repository.js';
import { insertSubRun } from '../src/runs/sub-run-repository.js';
import type { RunEnvelope } from '../src/runs/run-types.js';
import { createTestDatabase, hasPostgresServer, type TestDatabase } from './helpers/database.js';
import type { AdmissibleTool, AdmissionPorts } from '../src/admission/ports.js';
import { grantQueryOf, grantStage } from '../src/admission/stages/04-grant.js';
import type { AgentPrincipal, StepRequest, StepState } from '../src/admission/step.js';
import { AuditLog } from '../src/audit/audit-log.js';
import {
  appendCarrying,
  linkSql,
  readChainHead,
  writeAuditEvents,
  type AppendRider,
  type TimedAuditEvent,
} from '../src/audit/audit-repository.js';
import { hexOf } from '../src/audit/audit-listing.js';
import { verifyAuditChain } from '../src/audit/chain-verification.js';
import { linkHash, sealLinked } from '../src/audit/audit-hash.js';
import {
  callEndRider,
  runEndRider,
  runStartGuard,
  type RunStartChange,
  type CallEnd,
  type CallEndAnswer,
} from '../src/runs/run-end-rider.js';
import { lockWaits, until } from './helpers/waits.js';
import { GrantService } from '../src/grants/grant-service.js';
import { GrantUses } from '../src/grants/grant-admission.js';
import { recordGrantUsesIf } from '../src/grants/grant-snapshot-repository.js';
import { ManualClock } from './helpers/manual-clock.js';
import { chainRecord } from './helpers/audit.js';

// The statements the hot path of POST /runs/execute group-commits: many callers, one statement.
// Each is called directly here, with batches that mix every case, against a real database.
let testDb: TestDatabase;
let db: Kysely<DB>;
const clock = new ManualClock('2030-04-08T10:00:00.000Z');
let seq = 0;

beforeAll(async () => {
  testDb = await createTestDatabase({ chain: 'open' });
  db = testDb.database.control;
});
afterAll(async () => {
  await testDb.drop();
});

/** A name of its own for each use, so that tests never meet. */
function fresh(prefix: string): string {
  seq += 1;
  return `${prefix}-${seq}`;
}

function newRun(tenant: string, runId: string, extra: Partial<NewRun> = {}): NewRun {
  return {
    tenant_id: tenant,
    run_id: runId,
    agent_id: 'agent.batch',
    trace_id: `trace-${runId}`,
    request_sha256: `sha-${runId}`,
    request: { run_id: runId, context: { why: runId }, plan: [{ tool_id: 'echo', input: { q: runId } }] },
    agent_family: 'batchers',
    agent_scopes: ['scf:read'],
    keep_open: false,
    budget_units: undefined,
    created_at: new Date('2030-04-08T10:00:00.123Z'),
    executor_id: 'rep_batch',
    ...extra,
  };
}

const envelope = (runId: string, status: RunEnvelope['status']): RunEnvelope => ({
  run_id: runId,
  status,
  dry_run: false,
  steps: [],
  warnings: [`ended ${status}`],
});

async function claimOne(tenant: string, runId: string): Promise<void> {
  const [claimed] = await claimRuns(db, [newRun(tenant, runId)]);
  expect(claimed).toBeDefined();
}

describe('claimRuns', () => {
  it('answers each position: new ids claimed, a repeat in the batch and an id taken before refused', async () => {
    const tenant = fresh('claim-t');
    await claimOne(tenant, 'taken-before');
    const batch = [
      newRun(tenant, 'zeta', { agent_id: 'agent.first' }),
      newRun(tenant, 'alpha'),
      newRun(tenant, 'taken-before', { agent_id: 'agent.late' }),
      // The same id again, by another agent: the first in the batch owns it.
      newRun(tenant, 'zeta', { agent_id: 'agent.second' }),
      newRun(tenant, 'mid'),
      newRun(tenant, 'zeta', { agent_id: 'agent.third' }),
    ];
    const answers = await claimRuns(db, batch);
    expect(answers.map((a) => (a ? `${a.run_id}:${a.agent_id}` : undefined))).toEqual([
      'zeta:agent.first',
      'alpha:agent.batch',
      undefined,
      undefined,
      'mid:agent.batch',
      undefined,
    ]);
    // What is stored agrees with the answers: the first claimant owns the repeated id, and the
    // id taken before keeps its first owner.
    expect((await findRun(db, tenant, 'zeta'))!.agent_id).toBe('agent.first');
    expect((await findRun(db, tenant, 'taken-before'))!.agent_id).toBe('agent.batch');
    const count = await db
      .selectFrom('runs')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .where('tenant_id', '=', tenant)
      .executeTakeFirstOrThrow();
    expect(Number(count.n)).toBe(4);
  });

  it('stores a claimed run running, busy, at epoch 1, with what the request gave', async () => {
    const tenant = fresh('claim-t');
    const input = newRun(tenant, 'stored', {
      session_id: 'sess-9',
      user_id: 'user-9',
      pipeline_instance_id: 'pipe-9',
      budget_units: 12.5,
      keep_open: true,
      agent_scopes: ['scf:read', 'scf:write'],
      created_at: new Date('2030-04-08T10:00:00.987Z'),
    });
    const [claimed] = await claimRuns(db, [input]);
    const stored = await findRun(db, tenant, 'stored');
    for (const record of [claimed, stored]) {
      expect(record).toMatchObject({
        tenant_id: tenant,
        run_id: 'stored',
        agent_id: 'agent.batch',
        parent_run_id: null,
        pipeline_instance_id: 'pipe-9',
        session_id: 'sess-9',
        user_id: 'user-9',
        status: 'running',
        busy: true,
        executor_id: 'rep_batch',
        epoch: 1,
        depth: 0,
        request_sha256: 'sha-stored',
        request: input.request,
        agent_family: 'batchers',
        agent_scopes: ['scf:read', 'scf:write'],
        budget_units: 12.5,
        keep_open: true,
        envelope: null,
        http_status: null,
        stop: null,
        // Milliseconds survive, so list cursors carrying created_at are exact.
        created_at: '2030-04-08T10:00:00.987Z',
        updated_at: '2030-04-08T10:00:00.987Z',
      });
    }
    const row = await db
      .selectFrom('runs')
      .select(['trace_id', 'owner_agent_id'])
      .where('tenant_id', '=', tenant)
      .where('run_id', '=', 'stored')
      .executeTakeFirstOrThrow();
    expect(row).toEqual({ trace_id: 'trace-stored', owner_agent_id: 'agent.batch' });
  });

  it('keeps run ids per tenant: the same id in two tenants is claimed twice, in one batch', async () => {
    const a = fresh('claim-a');
    const b = fresh('claim-b');
    const answers = await claimRuns(db, [
      newRun(b, 'shared', { agent_id: 'agent.b' }),
      newRun(a, 'shared', { agent_id: 'agent.a' }),
    ]);
    expect(answers.map((r) => r && [r.tenant_id, r.agent_id])).toEqual([
      [b, 'agent.b'],
      [a, 'agent.a'],
    ]);
    expect((await findRun(db, a, 'shared'))!.agent_id).toBe('agent.a');
    expect((await findRun(db, b, 'shared'))!.agent_id).toBe('agent.b');
  });

  it('answers an empty batch with nothing', async () => {
    expect(await claimRuns(db, [])).toEqual([]);
  });
});

describe('endRuns', () => {
  const leave = (
    tenant: string,
    runId: string,
    epoch = 1,
    status: RunEnding['status'] = 'completed',
    httpStatus = 200,
  ): RunEnding => ({
    tenant_id: tenant,
    run_id: runId,
    epoch,
    status,
    httpStatus,
    envelope: envelope(runId, status),
  });

  const rowOf = async (tenant: string, runId: string) => {
    const run = (await findRun(db, tenant, runId))!;
    return {
      status: run.status,
      busy: run.busy,
      epoch: run.epoch,
      http_status: run.http_status,
      envelope: run.envelope,
      updated_at: run.updated_at,
    };
  };

  it('ends a running run of its epoch: status, http status and envelope stored, no longer busy', async () => {
    const tenant = fresh('leave-t');
    await claimOne(tenant, 'ends');
    expect(await endRuns(db, [leave(tenant, 'ends', 1, 'failed', 502)])).toEqual([true]);
    expect(await rowOf(tenant, 'ends')).toMatchObject({
      status: 'failed',
      busy: false,
      epoch: 1,
      http_status: 502,
      envelope: envelope('ends', 'failed'),
    });
  });

  it('leaves a run of another epoch alone', async () => {
    const tenant = fresh('leave-t');
    await claimOne(tenant, 'epoch');
    const before = await rowOf(tenant, 'epoch');
    expect(await endRuns(db, [leave(tenant, 'epoch', 2)])).toEqual([false]);
    expect(await rowOf(tenant, 'epoch')).toEqual(before);
  });

  it('leaves a run that is no longer running alone', async () => {
    const tenant = fresh('leave-t');
    await claimOne(tenant, 'killed');
    await db
      .updateTable('runs')
      .set({ status: 'killed' })
      .where('tenant_id', '=', tenant)
      .where('run_id', '=', 'killed')
      .execute();
    const before = await rowOf(tenant, 'killed');
    expect(before.status).toBe('killed');
    expect(await endRuns(db, [leave(tenant, 'killed')])).toEqual([false]);
    expect(await rowOf(tenant, 'killed')).toEqual(before);
  });

  it('does not end a run that has a sub-run (that end goes under the audit chain’s lock)', async () => {
    const tenant = fresh('leave-t');
    await claimOne(tenant, 'parent');
    await db.transaction().execute(async (trx) => {
      const sub = await insertSubRun(trx, {
        tenant_id: tenant,
        run_id: 'parent.sub',
        agent_id: 'agent.sub',
        parent_run_id: 'parent',
        status: 'queued',
        depth: 1,
        lineage: [{ run_id: 'parent', agent_id: 'agent.batch' }],
        budget_units: 3,
        trace_id: null,
        created_at: clock.now(),
      });
      expect(sub).toBeDefined();
    });
    const before = await rowOf(tenant, 'parent');
    expect(await endRuns(db, [leave(tenant, 'parent')])).toEqual([false]);
    expect(await rowOf(tenant, 'parent')).toEqual(before);
  });

  it('is not held back by a sub-run of a same-named run in another tenant', async () => {
    const tenant = fresh('leave-t');
    const other = fresh('leave-other');
    await claimOne(tenant, 'same-name');
    await claimOne(other, 'same-name');
    await db.transaction().execute(async (trx) => {
      await insertSubRun(trx, {
        tenant_id: other,
        run_id: 'same-name.sub',
        agent_id: 'agent.sub',
        parent_run_id: 'same-name',
        status: 'queued',
        depth: 1,
        lineage: [{ run_id: 'same-name', agent_id: 'agent.batch' }],
        budget_units: 3,
        trace_id: null,
        created_at: clock.now(),
      });
    });
    expect(await endRuns(db, [leave(other, 'same-name'), leave(tenant, 'same-name')])).toEqual([false, true]);
    expect((await rowOf(tenant, 'same-name')).status).toBe('completed');
    expect((await rowOf(other, 'same-name')).status).toBe('running');
  });

  it('answers each position of a mixed batch', async () => {
    const tenant = fresh('leave-t');
    for (const id of ['m-ok-1', 'm-epoch', 'm-paused', 'm-parent', 'm-ok-2']) await claimOne(tenant, id);
    await db
      .updateTable('runs')
      .set({ status: 'paused' })
      .where('tenant_id', '=', tenant)
      .where('run_id', '=', 'm-paused')
      .execute();
    await db.transaction().execute(async (trx) => {
      await insertSubRun(trx, {
        tenant_id: tenant,
        run_id: 'm-parent.sub',
        agent_id: 'agent.sub',
        parent_run_id: 'm-parent',
        status: 'awaiting_approval',
        depth: 1,
        lineage: [{ run_id: 'm-parent', agent_id: 'agent.batch' }],
        budget_units: 1,
        trace_id: null,
        created_at: clock.now(),
      });
    });
    const answers = await endRuns(db, [
      leave(tenant, 'm-ok-2', 1, 'failed', 500),
      leave(tenant, 'm-epoch', 7),
      leave(tenant, 'm-parent'),
      leave(tenant, 'm-missing'),
      leave(tenant, 'm-paused'),
      leave(tenant, 'm-ok-1', 1, 'killed', 402),
    ]);
    expect(answers).toEqual([true, false, false, false, false, true]);
    expect(await rowOf(tenant, 'm-ok-1')).toMatchObject({ status: 'killed', http_status: 402, busy: false });
    expect(await rowOf(tenant, 'm-ok-2')).toMatchObject({ status: 'failed', http_status: 500, busy: false });
    expect(await rowOf(tenant, 'm-epoch')).toMatchObject({ status: 'running', busy: true, envelope: null });
    expect(await rowOf(tenant, 'm-parent')).toMatchObject({ status: 'running', busy: true, envelope: null });
    expect(await rowOf(tenant, 'm-paused')).toMatchObject({ status: 'paused', envelope: null });
    expect(await findRun(db, tenant, 'm-missing')).toBeUndefined();
  });

  it('answers a stale executor false even when the current one ends the same run in the same batch', async () => {
    // Two executors of one run (the old one from before a pause and resume, epoch 1; the new
    // one, epoch 2) let go at the same moment, so their leaves share a batch. Only the current
    // epoch's leave ends the run; the stale one must hear false, as it would alone.
    const tenant = fresh('leave-t');
    await claimOne(tenant, 'twice');
    await db
      .updateTable('runs')
      .set({ epoch: 2 })
      .where('tenant_id', '=', tenant)
      .where('run_id', '=', 'twice')
      .execute();
    const answers = await endRuns(db, [
      leave(tenant, 'twice', 1, 'failed', 500),
      leave(tenant, 'twice', 2, 'completed', 200),
    ]);
    expect(await rowOf(tenant, 'twice')).toMatchObject({ status: 'completed', http_status: 200, epoch: 2 });
    expect(answers).toEqual([false, true]);
  });
});

describe('an append linked in the database, carrying run ends', () => {
  const leave = (tenant: string, runId: string, epoch = 1): RunEnding => ({
    tenant_id: tenant,
    run_id: runId,
    epoch,
    status: 'completed',
    httpStatus: 200,
    envelope: envelope(runId, 'completed'),
  });
  const event = (tenant: string, runId: string, endRun?: RunEnding): TimedAuditEvent<RunEnding> => ({
    occurredAt: clock.now(),
    event: { event_type: 'run.step.completed', actor: 'agent:agent.batch', tenant_id: tenant, run_id: runId },
    ...(endRun ? { rides: endRun } : {}),
  });
  const statusOf = async (tenant: string, runId: string) => (await findRun(db, tenant, runId))!.status;

  it('links each record as linkHash does: the SQL and the TypeScript rule agree', async () => {
    const cases: [number, string, string][] = [
      [1, '0'.repeat(64), 'a'.repeat(64)],
      [9_007_199_254_740_991, 'f'.repeat(64), '0123456789abcdef'.repeat(4)],
    ];
    for (const [seq, prev, content] of cases) {
      const linked = await sql<{
        hash: string;
      }>`select ${linkSql(sql`${seq}::bigint`, sql`${prev}::text`, sql`${content}::text`)} as hash`.execute(db);
      expect(linked.rows[0]!.hash).toBe(linkHash(seq, prev, content));
    }
    const tenant = fresh('append-link-t');
    const before = await readChainHead(db);
    const { records } = await appendCarrying(db, [event(tenant, 'a'), event(tenant, 'b'), event(tenant, 'c')]);
    expect(records.map((r) => r.seq)).toEqual([before.seq + 1, before.seq + 2, before.seq + 3]);
    expect(records[0]!.prev_hash).toBe(before.hash);
    const stored = await db
      .selectFrom('audit_events')
      .select(['seq', hexOf('prev_hash').as('prev_hash'), hexOf('hash').as('hash'), 'hash_scheme'])
      .where('tenant_id', '=', tenant)
      .orderBy('seq')
      .execute();
    expect(stored.map((row) => [Number(row.seq), row.prev_hash, row.hash, row.hash_scheme])).toEqual(
      records.map((r) => [r.seq, r.prev_hash, r.hash, 2]),
    );
    for (const record of records.map(chainRecord)) {
      const { hash, hash_scheme: _scheme, ...unhashed } = record;
      expect(sealLinked(unhashed).hash).toBe(hash);
    }
    expect(await readChainHead(db)).toEqual({ seq: records[2]!.seq, hash: records[2]!.hash });
  });

  it('drops a guarded event whose change cannot be made, and links the rest without a gap', async () => {
    const tenant = fresh('append-guard-t');
    await claimOne(tenant, 'taken');
    const granted = await grant({ tenant, scope: 'per-tenant', ref: tenant, tool: 'granted.tool' });
    expect(granted.id).toBeDefined();
    const plain = (runId: string): TimedAuditEvent<never, EndedRunStart> => ({
      occurredAt: clock.now(),
      event: { event_type: 'run.step.denied', actor: 'agent:agent.batch', tenant_id: tenant, run_id: runId },
    });
    const start = (runId: string, tool = 'no.grant'): TimedAuditEvent<never, EndedRunStart> => ({
      ...plain(runId),
      onlyIf: {
        run: newRun(tenant, runId),
        end: { status: 'failed', httpStatus: 403, envelope: envelope(runId, 'failed') },
        grantAbsent: { agent_id: 'agent.batch', tool_id: tool },
      },
    });
    const before = await readChainHead(db);
    const appended = await appendCarrying(
      db,
      [
        plain('plain-1'),
        start('fresh'),
        start('taken'),
        start('fresh'),
        start('with-grant', 'granted.tool'),
        plain('plain-2'),
      ],
      undefined,
      runStartGuard(),
    );
    expect(appended.appended).toEqual([true, true, false, false, false, true]);
    expect(appended.records.map((r) => [r.run_id, r.seq])).toEqual([
      ['plain-1', before.seq + 1],
      ['fresh', before.seq + 2],
      ['plain-2', before.seq + 3],
    ]);
    expect(await readChainHead(db)).toEqual({ seq: before.seq + 3, hash: appended.records[2]!.hash });
    expect(await findRun(db, tenant, 'fresh')).toMatchObject({ status: 'failed', http_status: 403, busy: false });
    expect(await findRun(db, tenant, 'taken')).toMatchObject({ status: 'running', busy: true });
    expect(await findRun(db, tenant, 'with-grant')).toBeUndefined();
    // The run and its record are one commit.
    const xids = await sql<{ xid: string }>`
      select xmin::text as xid from audit_events where event_id = ${appended.records[1]!.event_id}
      union all select xmin::text from runs where tenant_id = ${tenant} and run_id = 'fresh'`.execute(db);
    expect(new Set(xids.rows.map((r) => r.xid)).size).toBe(1);
    expect((await verifyAuditChain(db)).ok).toBe(true);
    // Nothing made, nothing appended: the head stays.
    const none = await appendCarrying(db, [start('taken')], undefined, runStartGuard());
    expect(none).toMatchObject({ records: [], appended: [false] });
    expect(await readChainHead(db)).toEqual({ seq: before.seq + 3, hash: appended.records[2]!.hash });
  });

  it('ends the runs its events carry, in the statement that appends them, and answers which ended', async () => {
    const tenant = fresh('append-end-t');
    await claimOne(tenant, 'ends');
    await claimOne(tenant, 'other-epoch');
    await claimOne(tenant, 'carried-none');
    const appended = await appendCarrying(
      db,
      [
        { ...event(tenant, 'ends', leave(tenant, 'ends')), eventId: '00000000-0000-4000-8000-00000000e0d1' },
        event(tenant, 'carried-none'),
        event(tenant, 'other-epoch', leave(tenant, 'other-epoch', 2)),
      ],
      runEndRider,
    );
    expect(appended.answers).toEqual([true, undefined, false]);
    expect(appended.records[0]!.event_id).toBe('00000000-0000-4000-8000-00000000e0d1');
    expect(await statusOf(tenant, 'ends')).toBe('completed');
    expect((await findRun(db, tenant, 'ends'))!.envelope).toEqual(envelope('ends', 'completed'));
    expect(await statusOf(tenant, 'other-epoch')).toBe('running');
    expect(await statusOf(tenant, 'carried-none')).toBe('running');
    // The record and the run's end are one commit.
    const xids = await sql<{ xid: string }>`
      select xmin::text as xid from audit_events where event_id = '00000000-0000-4000-8000-00000000e0d1'
      union all select xmin::text from runs where tenant_id = ${tenant} and run_id = 'ends'`.execute(db);
    expect(new Set(xids.rows.map((r) => r.xid)).size).toBe(1);
  });

  it.skipIf(!hasPostgresServer)(
    'links its batch after the record another writer committed while it waited for the head (needs a PostgreSQL server)',
    async () => {
      const tenant = fresh('append-fresh-t');
      const watcher = new pg.Client({ connectionString: testDb.url! });
      await watcher.connect();
      let letGo!: () => void;
      const gate = new Promise<void>((resolve) => (letGo = resolve));
      let wrote!: () => void;
      const written = new Promise<void>((resolve) => (wrote = resolve));
      try {
        // Another writer holds the head, uncommitted, having appended a record.
        const holder = db.transaction().execute(async (trx) => {
          const [record] = await writeAuditEvents(trx, [event(tenant, 'holder')]);
          wrote();
          await gate;
          return record!;
        });
        await written;
        const attempt = appendCarrying(db, [event(tenant, 'waiter'), event(tenant, 'waiter')]);
        await until('the append to wait for the head', async () => (await lockWaits(watcher)) > 0);
        letGo();
        const held = await holder;
        // Read as it stood when the statement began, the head would be the one before `held`.
        const { records } = await attempt;
        expect(records.map((r) => [r.seq, r.prev_hash])).toEqual([
          [held.seq + 1, held.hash],
          [held.seq + 2, records[0]!.hash],
        ]);
      } finally {
        letGo();
        await watcher.end();
      }
      expect((await verifyAuditChain(db)).ok).toBe(true);
    },
  );

  it.skipIf(!hasPostgresServer)(
    'inside a transaction, ends the free runs and skips a held one without waiting for it (needs a PostgreSQL server)',
    async () => {
      const tenant = fresh('append-end-t');
      await claimOne(tenant, 'free');
      await claimOne(tenant, 'held');
      const holder = new pg.Client({ connectionString: testDb.url! });
      await holder.connect();
      try {
        await holder.query('begin');
        await holder.query("select 1 from runs where tenant_id = $1 and run_id = 'held' for no key update", [tenant]);
        const appended = await db
          .transaction()
          .execute((trx) =>
            appendCarrying(
              trx,
              [event(tenant, 'held', leave(tenant, 'held')), event(tenant, 'free', leave(tenant, 'free'))],
              runEndRider,
            ),
          );
        expect(appended.answers).toEqual([false, true]);
        expect(appended.records).toHaveLength(2);
      } finally {
        await holder.query('rollback');
        await holder.end();
      }
      expect(await statusOf(tenant, 'free')).toBe('completed');
      expect(await statusOf(tenant, 'held')).toBe('running');
    },
  );

  it('does not end a run that has a sub-run', async () => {
    const tenant = fresh('append-end-t');
    await claimOne(tenant, 'parent');
    await db.transaction().execute((trx) =>
      insertSubRun(trx, {
        tenant_id: tenant,
        run_id: 'parent.sub',
        agent_id: 'agent.sub',
        parent_run_id: 'parent',
        status: 'queued',
        depth: 1,
        lineage: [{ run_id: 'parent', agent_id: 'agent.batch' }],
        budget_units: 3,
        trace_id: null,
        created_at: clock.now(),
      }),
    );
    const appended = await appendCarrying(db, [event(tenant, 'parent', leave(tenant, 'parent'))], runEndRider);
    expect(appended.answers).toEqual([false]);
    expect(await statusOf(tenant, 'parent')).toBe('running');
  });
});

interface GrantFields {
  tenant: string;
  agent?: string;
  tool?: string;
  scope: GrantScope;
  ref: string;
}

async function grant({ tenant, agent = 'agent.batch', tool = 'echo', scope, ref }: GrantFields): Promise<Grant> {
  return db.transaction().execute((trx) =>
    insertGrant(trx, {
      id: fresh('grt_batch'),
      tenant_id: tenant,
      agent_id: agent,
      tool_id: tool,
      scope,
      scope_ref: ref,
      capability_modifiers: {},
      expires_at: new Date('2031-01-01T00:00:00.000Z'),
      granted_by: { actor_id: 'alice', actor_role: 'tenant-operator' },
      rationale: 'batched statements under test',
      granted_at: clock.now(),
      renewed_from: null,
    }),
  );
}

async function revoke(id: string): Promise<void> {
  const revoked = await db.transaction().execute((trx) =>
    revokeGrant(trx, {
      id,
      by: { actor_id: 'alice', actor_role: 'tenant-operator' },
      reason: 'pulled',
      at: clock.now(),
    }),
  );
  expect(revoked).toBeDefined();
}

/** A grant's version (its place in the order of grant changes). */
async function versionOf(id: string): Promise<number> {
  return Number(
    (await db.selectFrom('grants').select('version').where('id', '=', id).executeTakeFirstOrThrow()).version,
  );
}

/** A ledger of its own, as a replica has, on the test's clock. */
function newLedger(): BudgetLedger {
  return new BudgetLedger(testDb.database, {
    now: clock.now,
    registry: new Registry(),
    reservationTtlMs: 900_000,
    sweepIntervalMs: 0,
  });
}

/** A tenant's monthly budget, warning only at its limit. */
async function monthly(tenant: string, limitUnits: number): Promise<string> {
  const result = await createBudget(
    db,
    {
      tenant_id: tenant,
      scope: 'tenant',
      agent_id: null,
      run_id: null,
      period: 'month',
      limit_units: limitUnits,
      warn_ratio: 1,
      grace_units: 0,
    },
    { actor: 'operator:test', traceId: null, now: clock.now() },
  );
  if (!result.ok) throw new Error('budget conflict');
  return result.usage.budget.id;
}

/** A tenant's grant uses as `grant/run`, in key order. */
async function usesOf(tenant: string): Promise<string[]> {
  return (
    await db
      .selectFrom('run_grant_uses')
      .select(['grant_id', 'run_id'])
      .where('tenant_id', '=', tenant)
      .orderBy('grant_id')
      .orderBy('run_id')
      .execute()
  ).map((u) => `${u.grant_id}/${u.run_id}`);
}

describe('claimRuns with the use of the first call grant', () => {
  it('records the use with each run it claims, only where the decision still stands', async () => {
    const tenant = fresh('claim-use-t');
    await claimOne(tenant, 'taken-before');
    const live = await grant({ tenant, scope: 'per-tenant', ref: tenant });
    const before = await versionOf(live.id);
    // A newer grant of the same subject: a decision from a copy that had not seen it is stale.
    const newer = await grant({ tenant, scope: 'per-run', ref: 'run-stale' });
    const now = await versionOf(newer.id);
    const pulled = await grant({ tenant, tool: 'search', scope: 'per-tenant', ref: tenant });
    await revoke(pulled.id);
    const decided = (runId: string, grantId: string, since: number, tool = 'echo') => ({
      tenant_id: tenant,
      run_id: runId,
      grant_id: grantId,
      assumed: { agent_id: 'agent.batch', tool_id: tool, since, decided_at: clock.now() },
    });
    const claimed = await claimRuns(db, [
      newRun(tenant, 'run-live', { reliance: decided('run-live', live.id, now) }),
      newRun(tenant, 'run-stale', { reliance: decided('run-stale', live.id, before) }),
      newRun(tenant, 'run-pulled', { reliance: decided('run-pulled', pulled.id, now, 'search') }),
      newRun(tenant, 'taken-before', { reliance: decided('taken-before', live.id, now) }),
      newRun(tenant, 'run-plain'),
    ]);
    expect(claimed.map((run) => run?.relied)).toEqual([true, false, false, undefined, false]);
    expect(claimed.slice(0, 3).every((run) => run?.status === 'running')).toBe(true);
    // Only the standing decision left a row; none for a run this batch did not claim.
    expect(await usesOf(tenant)).toEqual([`${live.id}/run-live`]);
  });
});

describe("claimRuns with its first calls' reservations", () => {
  let ledger: BudgetLedger;
  beforeAll(() => {
    ledger = newLedger();
  });
  afterAll(async () => {
    await ledger.close();
  });

  async function world(limitUnits: number) {
    const tenant = fresh('claim-charge-t');
    const budgetId = await monthly(tenant, limitUnits);
    const live = await grant({ tenant, scope: 'per-tenant', ref: tenant });
    const version = await versionOf(live.id);
    // What the ledger last saw of this tenant: a call before.
    const warm = await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'warm', units: 1 });
    expect(warm.ok).toBe(true);
    const charge = (runId: string, units: number) => ({
      tenantId: tenant,
      agentId: 'agent.batch',
      runId,
      units,
      keepsRunTotal: false,
    });
    const relying = (runId: string, since = version) => ({
      reliance: {
        tenant_id: tenant,
        run_id: runId,
        grant_id: live.id,
        assumed: { agent_id: 'agent.batch', tool_id: 'echo', since, decided_at: clock.now() },
      },
    });
    const reserved = async () => (await getBudget(db, budgetId, clock.now()))!.reserved_units;
    const rows = async (runId: string) =>
      (
        await db
          .selectFrom('budget_reservations')
          .select(['id', 'status', 'units'])
          .where('tenant_id', '=', tenant)
          .where('run_id', '=', runId)
          .execute()
      ).map((row) => ({ id: row.id, status: row.status, units: Number(row.units) }));
    return { tenant, version, charge, relying, reserved, rows };
  }

  it('reserves each first call in the claim, with its grant use', async () => {
    const w = await world(100);
    const runs = [
      newRun(w.tenant, 'one', { ...w.relying('one'), charge: w.charge('one', 2) }),
      newRun(w.tenant, 'two', { ...w.relying('two'), charge: w.charge('two', 3) }),
    ];
    const prepared = ledger.prepare(runs.map((run) => run.charge!))!;
    expect(prepared).toBeDefined();
    const claimed = await claimRuns(db, runs, { runs, prepared });
    expect(claimed.map((run) => run?.relied)).toEqual([true, true]);
    expect(claimed.map((run) => run?.reservation?.units)).toEqual([2, 3]);
    expect(await w.rows('one')).toEqual([{ id: claimed[0]!.reservation!.id, status: 'reserved', units: 2 }]);
    expect(await w.rows('two')).toEqual([{ id: claimed[1]!.reservation!.id, status: 'reserved', units: 3 }]);
    expect(await w.reserved()).toBe(1 + 5);
    // Settled as any reservation is.
    expect(await ledger.settle(claimed[0]!.reservation!, 2)).toBe('settled');
  });

  it('reserves nothing when a grant use in the batch no longer stands, and claims the runs all the same', async () => {
    const w = await world(100);
    // A newer grant of the subject: a decision from a copy that had not seen it no longer stands.
    const newer = await grant({ tenant: w.tenant, scope: 'per-run', ref: 'stale' });
    const now = await versionOf(newer.id);
    const runs = [
      newRun(w.tenant, 'fresh', { ...w.relying('fresh', now), charge: w.charge('fresh', 2) }),
      newRun(w.tenant, 'stale', { ...w.relying('stale'), charge: w.charge('stale', 2) }),
    ];
    const prepared = ledger.prepare(runs.map((run) => run.charge!))!;
    const claimed = await claimRuns(db, runs, { runs, prepared });
    expect(claimed.map((run) => [run?.status, run?.relied, run?.reservation])).toEqual([
      ['running', true, undefined],
      ['running', false, undefined],
    ]);
    expect([...(await w.rows('fresh')), ...(await w.rows('stale'))]).toEqual([]);
    expect(await w.reserved()).toBe(1);
  });

  it('reserves nothing when the budget moved past what the decision allowed', async () => {
    const w = await world(5);
    const runs = [newRun(w.tenant, 'late', { ...w.relying('late'), charge: w.charge('late', 3) })];
    const prepared = ledger.prepare(runs.map((run) => run.charge!))!;
    // Another replica takes the room meanwhile: 1 + 2 reserved, 3 more would reach the warning at 5.
    const other = newLedger();
    expect((await other.reserve(w.charge('elsewhere', 2))).ok).toBe(true);
    await other.close();
    const [claimed] = await claimRuns(db, runs, { runs, prepared });
    expect(claimed).toMatchObject({ status: 'running', relied: true, reservation: undefined });
    expect(await w.rows('late')).toEqual([]);
    expect(await w.reserved()).toBe(3);
    // What the ledger learned: the same call, asked again, is refused.
    expect((await ledger.reserve(w.charge('late', 3))).ok).toBe(false);
  });

  it('answers a first call its budget refuses, when the statement finds the levels it refused it on', async () => {
    const w = await world(5); // 1 of 5 held
    const runs = [
      newRun(w.tenant, 'fits', { ...w.relying('fits'), charge: w.charge('fits', 2) }),
      newRun(w.tenant, 'over', { ...w.relying('over'), charge: w.charge('over', 3) }),
    ];
    const prepared = ledger.prepare(runs.map((run) => run.charge!))!;
    expect(prepared).toBeDefined();
    const claimed = await claimRuns(db, runs, { runs, prepared });
    expect(claimed.map((run) => run?.reservation?.units)).toEqual([2, undefined]);
    expect(claimed[0]!.refusal).toBeUndefined();
    expect(claimed[1]).toMatchObject({
      relied: true,
      refusal: { source: 'budget', limit_units: 5, consumed_units: 3, requested_units: 3 },
    });
    expect(await w.rows('over')).toEqual([]);
    expect(await w.reserved()).toBe(3);
  });

  it('answers no refusal when the levels it refused on changed meanwhile, and the call then fits', async () => {
    const w = await world(5);
    const held = await ledger.reserve(w.charge('held', 3)); // the ledger knows 4 of 5
    if (!held.ok) throw new Error('expected room');
    const other = newLedger();
    expect(await other.release(held.reservation)).toBe('released'); // 1 of 5, elsewhere
    await other.close();
    const runs = [newRun(w.tenant, 'after', { ...w.relying('after'), charge: w.charge('after', 2) })];
    const prepared = ledger.prepare(runs.map((run) => run.charge!))!;
    expect(prepared).toBeDefined();
    const [claimed] = await claimRuns(db, runs, { runs, prepared });
    expect(claimed).toMatchObject({ status: 'running', relied: true, reservation: undefined, refusal: undefined });
    // What the ledger learned: the call fits.
    expect((await ledger.reserve(w.charge('after', 2))).ok).toBe(true);
  });
});

describe('AuditLog.shared, whether others append to the chain too', () => {
  it('says so for a while after a batch finds a head the log did not leave', async () => {
    const log = new AuditLog(testDb.database, { now: () => clock.now() });
    const tenant = fresh('shared-t');
    const event = { event_type: 'test.event', actor: 'system', tenant_id: tenant };
    await log.append(event);
    await log.append(event);
    expect(log.shared()).toBe(false);
    // Another writer (a replica, a control-plane change) appends in between.
    await db.transaction().execute((trx) => writeAuditEvents(trx, [{ event, occurredAt: clock.now() }]));
    expect(log.shared()).toBe(false);
    await log.append(event);
    expect(log.shared()).toBe(true);
    await log.drain();
  });
});

describe("a first call's intent record claiming its run (runStartGuard)", () => {
  const answersOf = (appended: { answers: unknown[] }) => appended.answers as Array<ClaimedRunStartAnswer | undefined>;
  let ledger: BudgetLedger;
  beforeAll(() => {
    ledger = newLedger();
  });
  afterAll(async () => {
    await ledger.close();
  });

  async function world() {
    const tenant = fresh('claim-intent-t');
    const budgetId = await monthly(tenant, 100);
    const live = await grant({ tenant, scope: 'per-tenant', ref: tenant });
    const version = await versionOf(live.id);
    expect((await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'warm', units: 1 })).ok).toBe(true);
    const start = (runId: string, units: number, since = version): RunStartChange => {
      const charge = { tenantId: tenant, agentId: 'agent.batch', runId, units, keepsRunTotal: false };
      const decided = ledger.prepare([charge])!.decided[0]!;
      if (!decided.ok) throw new Error('expected room');
      return {
        claim: newRun(tenant, runId, {
          reliance: {
            tenant_id: tenant,
            run_id: runId,
            grant_id: live.id,
            assumed: { agent_id: 'agent.batch', tool_id: 'echo', since, decided_at: clock.now() },
          },
          charge: { ...charge, reservationId: decided.reservation.id },
        }) as NonNullable<ClaimedRunStart['claim']>,
      };
    };
    const intent = (runId: string, onlyIf?: RunStartChange): TimedAuditEvent<never, RunStartChange> => ({
      occurredAt: clock.now(),
      event: { event_type: 'run.step.dispatching', actor: 'agent:agent.batch', tenant_id: tenant, run_id: runId },
      ...(onlyIf ? { onlyIf } : {}),
    });
    const reservations = async () =>
      (
        await db
          .selectFrom('budget_reservations')
          .select(['id', 'run_id', 'status'])
          .where('tenant_id', '=', tenant)
          .where('run_id', '!=', 'warm')
          .orderBy('run_id')
          .execute()
      ).map((row) => `${row.run_id}:${row.id}:${row.status}`);
    const reserved = async () => (await getBudget(db, budgetId, clock.now()))!.reserved_units;
    return { tenant, live, start, intent, reservations, reserved };
  }

  it('claims each run with its grant use and its reservation, in the commit of its record, or appends nothing', async () => {
    const w = await world();
    await claimOne(w.tenant, 'taken');
    const one = w.start('one', 2);
    const two = w.start('two', 3);
    const taken = w.start('taken', 4);
    const ended: RunStartChange = {
      run: newRun(w.tenant, 'ended'),
      end: { status: 'failed', httpStatus: 403, envelope: envelope('ended', 'failed') },
      grantAbsent: { agent_id: 'agent.batch', tool_id: 'no.grant' },
    };
    const before = await readChainHead(db);
    const appended = await appendCarrying(
      db,
      [
        w.intent('plain'),
        w.intent('one', one),
        w.intent('ended', ended),
        w.intent('taken', taken),
        w.intent('two', two),
      ],
      undefined,
      runStartGuard(ledger),
    );
    // A taken id: nothing of it written, so none of the batch's reservations either (all or none, as a claim's):
    // the other runs are claimed, with their grant uses, and their records left out.
    expect(appended.appended).toEqual([true, false, true, false, false]);
    expect(appended.records.map((r) => [r.run_id, r.seq])).toEqual([
      ['plain', before.seq + 1],
      ['ended', before.seq + 2],
    ]);
    expect(appended.answers).toEqual([
      undefined,
      { claimed: true, relied: true, reservation: undefined, refusal: undefined },
      undefined,
      { claimed: false, taken: true, relied: false },
      { claimed: true, relied: true, reservation: undefined, refusal: undefined },
    ]);
    expect(await w.reservations()).toEqual([]);
    expect(await w.reserved()).toBe(1);
    expect((await verifyAuditChain(db)).ok).toBe(true);
  });

  it('appends the records of the runs that got all three, in one commit with their rows', async () => {
    const w = await world();
    const one = w.start('one', 2);
    const two = w.start('two', 3);
    const appended = await appendCarrying(
      db,
      [w.intent('one', one), w.intent('two', two)],
      undefined,
      runStartGuard(ledger),
    );
    expect(appended.appended).toEqual([true, true]);
    const ids = [one, two].map((s) => ('claim' in s ? s.claim!.charge!.reservationId : undefined));
    expect(answersOf(appended).map((a) => a && [a.claimed, a.relied, a.reservation?.id])).toEqual([
      [true, true, ids[0]],
      [true, true, ids[1]],
    ]);
    expect(await w.reservations()).toEqual([`one:${ids[0]}:reserved`, `two:${ids[1]}:reserved`]);
    expect(await w.reserved()).toBe(1 + 5);
    expect(await findRun(db, w.tenant, 'one')).toMatchObject({ status: 'running', busy: true, epoch: 1 });
    const xids = await sql<{ xid: string }>`
      select xmin::text as xid from audit_events where event_id = ${appended.records[0]!.event_id}
      union all select xmin::text from runs where tenant_id = ${w.tenant} and run_id = 'one'
      union all select xmin::text from run_grant_uses where tenant_id = ${w.tenant} and run_id = 'one'
      union all select xmin::text from budget_reservations where id = ${ids[0]!}`.execute(db);
    expect(xids.rows).toHaveLength(4);
    expect(new Set(xids.rows.map((r) => r.xid)).size).toBe(1);
    // What the ledger learned from the statement: the next guess starts from the levels it left (1 + 5 of 100).
    const asked = { tenantId: w.tenant, agentId: 'agent.batch', runId: 'next', units: 95, keepsRunTotal: false };
    const next = ledger.prepare([asked]);
    expect(next?.decided[0]).toMatchObject({ ok: false, details: { consumed_units: 6, requested_units: 95 } });
  });

  it('claims a run whose grant use no longer stands without its record, and reserves nothing', async () => {
    const w = await world();
    // A newer grant of the subject: a decision from a copy that had not seen it no longer stands.
    const newer = await grant({ tenant: w.tenant, scope: 'per-run', ref: 'stale' });
    const fresh = w.start('fresh', 2, await versionOf(newer.id));
    const stale = w.start('stale', 2);
    const appended = await appendCarrying(
      db,
      [w.intent('fresh', fresh), w.intent('stale', stale)],
      undefined,
      runStartGuard(ledger),
    );
    expect(appended.appended).toEqual([false, false]);
    expect(answersOf(appended).map((a) => a && [a.claimed, a.relied, a.reservation])).toEqual([
      [true, true, undefined],
      [true, false, undefined],
    ]);
    expect(await w.reservations()).toEqual([]);
    expect(await findRun(db, w.tenant, 'stale')).toMatchObject({ status: 'running', busy: true });
  });
});

describe('recordGrantUsesIf, for uses decided from the database', () => {
  it('records uses of live grants, refuses revoked ones without recording them, and takes repeats', async () => {
    const tenant = fresh('uses-t');
    await claimOne(tenant, 'run-a');
    await claimOne(tenant, 'run-b');
    const live = await grant({ tenant, scope: 'per-tenant', ref: tenant });
    const other = await grant({ tenant, tool: 'search', scope: 'per-tenant', ref: tenant });
    const pulled = await grant({ tenant, scope: 'per-run', ref: 'run-b' });
    await revoke(pulled.id);
    const answers = await recordGrantUsesIf(db, [
      { tenant_id: tenant, run_id: 'run-a', grant_id: live.id },
      { tenant_id: tenant, run_id: 'run-b', grant_id: pulled.id },
      { tenant_id: tenant, run_id: 'run-a', grant_id: live.id },
      { tenant_id: tenant, run_id: 'run-b', grant_id: live.id },
      { tenant_id: tenant, run_id: 'run-b', grant_id: other.id },
      { tenant_id: tenant, run_id: 'run-a', grant_id: pulled.id },
    ]);
    expect(answers).toEqual([true, false, true, true, true, false]);
    expect(await usesOf(tenant)).toEqual([`${live.id}/run-a`, `${live.id}/run-b`, `${other.id}/run-b`].sort());
  });

  it('answers true again for a use already recorded, keeping one row', async () => {
    const tenant = fresh('uses-t');
    await claimOne(tenant, 'again');
    const live = await grant({ tenant, scope: 'per-run', ref: 'again' });
    const use = { tenant_id: tenant, run_id: 'again', grant_id: live.id };
    expect(await recordGrantUsesIf(db, [use])).toEqual([true]);
    expect(await recordGrantUsesIf(db, [use, use])).toEqual([true, true]);
    expect(await usesOf(tenant)).toEqual([`${live.id}/again`]);
    // Revoked afterwards: later uses are refused, the recorded one stays (the cascade needs it).
    await revoke(live.id);
    expect(await recordGrantUsesIf(db, [use])).toEqual([false]);
    expect(await usesOf(tenant)).toEqual([`${live.id}/again`]);
  });
});

describe('findGrantCandidates', () => {
  it('answers each question in its position with exactly the grants its context matches', async () => {
    const t1 = fresh('cand-t');
    const t2 = fresh('cand-t');
    const g = {
      run1: await grant({ tenant: t1, scope: 'per-run', ref: 'run-1' }),
      run1Revoked: await grant({ tenant: t1, scope: 'per-run', ref: 'run-1' }),
      run2: await grant({ tenant: t1, scope: 'per-run', ref: 'run-2' }),
      session: await grant({ tenant: t1, scope: 'per-session', ref: 'sess-1' }),
      // A scope_ref equal to the run id, under another scope: it names a session, not the run.
      sessionNamedRun1: await grant({ tenant: t1, scope: 'per-session', ref: 'run-1' }),
      pipeline: await grant({ tenant: t1, scope: 'per-pipeline-instance', ref: 'pipe-1' }),
      user: await grant({ tenant: t1, scope: 'per-user', ref: 'user-1' }),
      tenant1: await grant({ tenant: t1, scope: 'per-tenant', ref: t1 }),
      otherTool: await grant({ tenant: t1, tool: 'search', scope: 'per-tenant', ref: t1 }),
      otherAgent: await grant({ tenant: t1, agent: 'agent.other', scope: 'per-tenant', ref: t1 }),
      tenant2: await grant({ tenant: t2, scope: 'per-tenant', ref: t2 }),
      tenant2Run1: await grant({ tenant: t2, scope: 'per-run', ref: 'run-1' }),
    };
    await revoke(g.run1Revoked.id);
    const q = (tenant: string, context: Record<string, string>, agent = 'agent.batch', tool = 'echo') => ({
      tenantId: tenant,
      agentId: agent,
      toolId: tool,
      context: { tenant_id: tenant, ...context },
    });
    const answers = await findGrantCandidates(db, [
      q(t1, { run_id: 'run-1', session_id: 'sess-1' }),
      q(t1, { run_id: 'run-2', pipeline_instance_id: 'pipe-1', user_id: 'user-1' }),
      q(t1, { run_id: 'run-1' }, 'agent.batch', 'no.such.tool'),
      q(t2, { run_id: 'run-1', session_id: 'sess-1' }),
      q(t1, {}, 'agent.other'),
      q(t1, { session_id: 'sess-1' }, 'agent.batch', 'search'),
      q(t1, { run_id: 'run-1', session_id: 'sess-1' }),
      q(t1, { run_id: 'run-3', session_id: 'sess-3' }, 'agent.nobody'),
    ]);
    const ids = (grants: Grant[]) => grants.map((x) => x.id).sort();
    const expected = (...grants: Grant[]) => ids(grants);
    expect(answers).toHaveLength(8);
    // Revoked grants are candidates too: the resolver tells "revoked" from "missing".
    expect(ids(answers[0]!)).toEqual(expected(g.run1, g.run1Revoked, g.session, g.tenant1));
    expect(ids(answers[1]!)).toEqual(expected(g.run2, g.pipeline, g.user, g.tenant1));
    expect(answers[2]).toEqual([]);
    expect(ids(answers[3]!)).toEqual(expected(g.tenant2, g.tenant2Run1));
    expect(ids(answers[4]!)).toEqual(expected(g.otherAgent));
    expect(ids(answers[5]!)).toEqual(expected(g.otherTool));
    // The same question twice gets the same answer twice.
    expect(ids(answers[6]!)).toEqual(ids(answers[0]!));
    expect(answers[7]).toEqual([]);
    // Each grant comes back whole, as stored.
    const revoked = answers[0]!.find((x) => x.id === g.run1Revoked.id)!;
    expect(revoked).toMatchObject({
      tenant_id: t1,
      agent_id: 'agent.batch',
      tool_id: 'echo',
      scope: 'per-run',
      scope_ref: 'run-1',
      revocation_reason: 'pulled',
    });
    expect(revoked.revoked_at).toBeInstanceOf(Date);
    expect(answers[0]!.find((x) => x.id === g.session.id)).toEqual(g.session);
  });

  it('answers a question whose context names nothing but its tenant, and no questions at all', async () => {
    const tenant = fresh('cand-t');
    const only = await grant({ tenant, scope: 'per-tenant', ref: tenant });
    await grant({ tenant, scope: 'per-run', ref: 'run-x' });
    const [answer] = await findGrantCandidates(db, [
      { tenantId: tenant, agentId: 'agent.batch', toolId: 'echo', context: { tenant_id: tenant } },
    ]);
    expect(answer!.map((x) => x.id)).toEqual([only.id]);
    expect(await findGrantCandidates(db, [])).toEqual([]);
  });
});

describe('closeAndUncharge', () => {
  let ledger: BudgetLedger;
  beforeAll(() => {
    ledger = newLedger();
  });
  afterAll(async () => {
    await ledger.close();
  });

  const usage = async (id: string) => {
    const u = (await getBudget(db, id, clock.now()))!;
    return { spent: u.spent_units, reserved: u.reserved_units };
  };

  const runTotal = (tenant: string, runId: string): CounterRef => ({
    key: runCounterKey(tenant, runId),
    periodStart: periodStart('total', clock.now()),
  });

  async function runTotals(tenant: string, runIds: string[]) {
    const refs = runIds.map((runId) => runTotal(tenant, runId));
    const levels = await readCounters(db, refs);
    return refs.map((ref) => levels.get(counterId(ref)));
  }

  function admitted(result: ReserveResult): BudgetReservation {
    if (!result.ok) throw new Error(`expected an admission, got ${JSON.stringify(result)}`);
    return result.reservation;
  }

  const reservationRow = (id: string) =>
    db
      .selectFrom('budget_reservations')
      .select(['status', 'actual_units', 'closed_at'])
      .where('id', '=', id)
      .executeTakeFirstOrThrow();

  it('closes a mixed batch in one call: units given back, settled costs charged, first close of an id wins', async () => {
    const tenant = fresh('close-t');
    const budget = await monthly(tenant, 100);
    const r1 = admitted(await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-1', units: 3 }));
    const r2 = admitted(await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-2', units: 5 }));
    const r3 = admitted(
      await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-3', units: 7.25 }),
    );
    expect(await usage(budget)).toEqual({ spent: 0, reserved: 15.25 });

    const at = new Date('2030-04-08T10:05:00.000Z');
    const closed = await closeAndUncharge(
      db,
      [
        { id: r1.id, status: 'settled', actualMicros: 2_500_000 },
        { id: r2.id, status: 'released', actualMicros: null },
        // A second close of r1: too late, it changes nothing.
        { id: r1.id, status: 'settled', actualMicros: 9_000_000 },
        { id: r3.id, status: 'expired', actualMicros: null },
        { id: 'bres_never_reserved', status: 'settled', actualMicros: 1_000_000 },
      ],
      at,
    );
    expect(closed.closed).toEqual(new Set([r1.id, r2.id, r3.id]));
    expect(await usage(budget)).toEqual({ spent: 2.5, reserved: 0 });
    // And the levels it left each counter it changed at, as the table now holds them.
    const counters = [
      { key: budget, periodStart: periodStart('month', clock.now()) },
      runTotal(tenant, 'run-1'),
      runTotal(tenant, 'run-2'),
      runTotal(tenant, 'run-3'),
    ];
    expect(closed.levels).toEqual(await readCounters(db, counters));
    expect(closed.levels.size).toBe(4);
    expect(await runTotals(tenant, ['run-1', 'run-2', 'run-3'])).toEqual([
      { spentMicros: 2_500_000, reservedMicros: 0 },
      { spentMicros: 0, reservedMicros: 0 },
      { spentMicros: 0, reservedMicros: 0 },
    ]);
    expect(await reservationRow(r1.id)).toMatchObject({ status: 'settled', actual_units: '2.500000', closed_at: at });
    expect(await reservationRow(r2.id)).toMatchObject({ status: 'released', actual_units: null, closed_at: at });
    expect(await reservationRow(r3.id)).toMatchObject({ status: 'expired', actual_units: null, closed_at: at });
  });

  it('closes nothing twice: an already-closed reservation is not returned and changes no counter', async () => {
    const tenant = fresh('close-t');
    const budget = await monthly(tenant, 100);
    const open = admitted(await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-1', units: 4 }));
    const done = admitted(await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-1', units: 6 }));
    const first = new Date('2030-04-08T10:01:00.000Z');
    expect(
      (await closeAndUncharge(db, [{ id: done.id, status: 'settled', actualMicros: 6_000_000 }], first)).closed,
    ).toEqual(new Set([done.id]));
    expect(await usage(budget)).toEqual({ spent: 6, reserved: 4 });

    const later = new Date('2030-04-08T10:02:00.000Z');
    const closed = await closeAndUncharge(
      db,
      [
        { id: done.id, status: 'settled', actualMicros: 6_000_000 },
        { id: done.id, status: 'released', actualMicros: null },
        { id: open.id, status: 'released', actualMicros: null },
      ],
      later,
    );
    expect(closed.closed).toEqual(new Set([open.id]));
    expect(await usage(budget)).toEqual({ spent: 6, reserved: 0 });
    expect(await runTotals(tenant, ['run-1'])).toEqual([{ spentMicros: 6_000_000, reservedMicros: 0 }]);
    expect(await reservationRow(done.id)).toMatchObject({
      status: 'settled',
      actual_units: '6.000000',
      closed_at: first,
    });

    expect(await closeAndUncharge(db, [{ id: open.id, status: 'settled', actualMicros: 1 }], later)).toEqual({
      closed: new Set(),
      late: new Set(),
      levels: new Map(),
    });
    expect(await usage(budget)).toEqual({ spent: 6, reserved: 0 });
  });

  it('through the ledger: settles and releases of one batch, the first close of a reservation wins', async () => {
    const tenant = fresh('close-t');
    const budget = await monthly(tenant, 50);
    const [a, b, c] = (
      await Promise.all(
        [1, 2, 3].map((n) =>
          ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: `run-${n}`, units: 10 }),
        ),
      )
    ).map(admitted);
    expect(await usage(budget)).toEqual({ spent: 0, reserved: 30 });
    const outcomes = await Promise.all([
      ledger.settle(a!, 4),
      ledger.release(a!),
      ledger.settle(b!, 10),
      ledger.release(c!),
      ledger.settle(c!, 1),
    ]);
    expect(outcomes).toEqual(['settled', 'already_closed', 'settled', 'released', 'already_closed']);
    expect(await usage(budget)).toEqual({ spent: 14, reserved: 0 });
    // Freed units are there to reserve again, exactly: 50 - 14 = 36.
    expect((await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-4', units: 36 })).ok).toBe(
      true,
    );
    expect(
      (await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'run-4', units: 0.000001 })).ok,
    ).toBe(false);
  });
});

describe('writeLedgerIf', () => {
  const total = periodStart('total', new Date(0));

  async function counters(...keys: string[]): Promise<CounterRef[]> {
    const refs = keys.map((key) => ({ key, periodStart: total }));
    await db
      .insertInto('budget_counters')
      .values(refs.map((ref) => ({ counter_key: ref.key, period_start: ref.periodStart })))
      .execute();
    return refs;
  }

  const levels = (refs: CounterRef[]) => readCounters(db, refs);
  const reservationCount = async (id: string) =>
    Number(
      (
        await db
          .selectFrom('budget_reservations')
          .select((eb) => eb.fn.countAll<number>().as('n'))
          .where('id', '=', id)
          .executeTakeFirstOrThrow()
      ).n,
    );

  const reservation = (id: string, unitsMicros: number, charges: CounterRef[]) => ({
    id,
    tenantId: 'cas-tenant',
    agentId: 'agent.batch',
    runId: 'run-cas',
    unitsMicros,
    charges,
  });

  const reservedAt = new Date('2030-04-08T10:00:00.000Z');
  const expiresAt = new Date('2030-04-08T10:15:00.000Z');

  it('writes every delta and reservation when every counter still holds what was read', async () => {
    const [a, b] = await counters(fresh('cas-a'), fresh('cas-b'));
    const expected = await levels([a!, b!]);
    const id = fresh('bres_cas');
    const ok = await writeLedgerIf(
      db,
      expected,
      [
        { ...a!, spentMicros: 0, reservedMicros: 2_000_000 },
        { ...b!, spentMicros: 1_500_000, reservedMicros: 2_000_000 },
      ],
      [reservation(id, 2_000_000, [a!, b!])],
      reservedAt,
      expiresAt,
    );
    expect(ok.ok).toBe(true);
    expect(await levels([a!, b!])).toEqual(
      new Map([
        [counterId(a!), { spentMicros: 0, reservedMicros: 2_000_000 }],
        [counterId(b!), { spentMicros: 1_500_000, reservedMicros: 2_000_000 }],
      ]),
    );
    // It answers the levels it left.
    expect(ok.levels).toEqual(await levels([a!, b!]));
    const row = await db.selectFrom('budget_reservations').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
    expect(row).toMatchObject({
      tenant_id: 'cas-tenant',
      agent_id: 'agent.batch',
      run_id: 'run-cas',
      units: '2.000000',
      status: 'reserved',
      reserved_at: reservedAt,
      expires_at: expiresAt,
      closed_at: null,
    });
    expect(row.charges).toEqual([
      { counter_key: a!.key, period_start: total.toISOString() },
      { counter_key: b!.key, period_start: total.toISOString() },
    ]);

    // Read again, written again: the expectation is the level the first write left.
    const again = await writeLedgerIf(
      db,
      await levels([a!, b!]),
      [{ ...a!, spentMicros: 0, reservedMicros: 1_000_000 }],
      [],
      reservedAt,
      expiresAt,
    );
    expect(again.ok).toBe(true);
    expect((await levels([a!]))!.get(counterId(a!))).toEqual({ spentMicros: 0, reservedMicros: 3_000_000 });
  });

  it('writes nothing when one of the counters moved after it was read', async () => {
    const [a, b] = await counters(fresh('cas-a'), fresh('cas-b'));
    const expected = await levels([a!, b!]);
    // Another replica reserves on b between this one's read and its write.
    await sql`update budget_counters set reserved_units = reserved_units + 1 where counter_key = ${b!.key}`.execute(db);
    const id = fresh('bres_cas');
    const ok = await writeLedgerIf(
      db,
      expected,
      [
        { ...a!, spentMicros: 0, reservedMicros: 5_000_000 },
        { ...b!, spentMicros: 0, reservedMicros: 5_000_000 },
      ],
      [reservation(id, 5_000_000, [a!, b!])],
      reservedAt,
      expiresAt,
    );
    expect(ok.ok).toBe(false);
    expect(await levels([a!, b!])).toEqual(
      new Map([
        [counterId(a!), { spentMicros: 0, reservedMicros: 0 }],
        [counterId(b!), { spentMicros: 0, reservedMicros: 1_000_000 }],
      ]),
    );
    expect(await reservationCount(id)).toBe(0);
    // It answers the levels as they stand, for the batch to be decided again from.
    expect(ok).toEqual({ ok: false, budgetsHeld: true, levels: await levels([a!, b!]) });
  });

  it('creates a counter it expects not to exist, with its delta', async () => {
    const [a] = await counters(fresh('cas-a'));
    const absent = { key: fresh('cas-new'), periodStart: total };
    const id = fresh('bres_cas');
    const ok = await writeLedgerIf(
      db,
      await levels([a!]),
      [
        { ...a!, spentMicros: 0, reservedMicros: 1_000_000 },
        { ...absent, spentMicros: 0, reservedMicros: 1_000_000 },
      ],
      [reservation(id, 1_000_000, [a!, absent])],
      reservedAt,
      expiresAt,
    );
    expect(ok.ok).toBe(true);
    expect(ok.levels).toEqual(await levels([a!, absent]));
    expect(await levels([a!, absent])).toEqual(
      new Map([
        [counterId(a!), { spentMicros: 0, reservedMicros: 1_000_000 }],
        [counterId(absent), { spentMicros: 0, reservedMicros: 1_000_000 }],
      ]),
    );
    expect(await reservationCount(id)).toBe(1);
  });

  it('writes nothing when a counter it expected not to exist was created meanwhile', async () => {
    const [a] = await counters(fresh('cas-a'));
    const expected = await levels([a!]);
    // Another writer creates the counter between this one's read and its write.
    const [appeared] = await counters(fresh('cas-appeared'));
    const id = fresh('bres_cas');
    const ok = await writeLedgerIf(
      db,
      expected,
      [
        { ...a!, spentMicros: 0, reservedMicros: 1_000_000 },
        { ...appeared!, spentMicros: 0, reservedMicros: 1_000_000 },
      ],
      [reservation(id, 1_000_000, [a!, appeared!])],
      reservedAt,
      expiresAt,
    );
    expect(ok).toEqual({ ok: false, budgetsHeld: false, levels: new Map() });
    expect(await levels([a!, appeared!])).toEqual(
      new Map([
        [counterId(a!), { spentMicros: 0, reservedMicros: 0 }],
        [counterId(appeared!), { spentMicros: 0, reservedMicros: 0 }],
      ]),
    );
    expect(await reservationCount(id)).toBe(0);
  });

  it('compares every counter it was decided against, changed or not', async () => {
    const [a, b] = await counters(fresh('cas-a'), fresh('cas-b'));
    const expected = await levels([a!, b!]);
    await sql`update budget_counters set spent_units = spent_units + 3 where counter_key = ${b!.key}`.execute(db);
    // b moved; this write leaves b as it is, but a decision was made from b's level.
    const changes = [
      { ...a!, spentMicros: 0, reservedMicros: 1_000_000 },
      { ...b!, spentMicros: 0, reservedMicros: 0 },
    ];
    expect((await writeLedgerIf(db, expected, changes, [], reservedAt, expiresAt)).ok).toBe(false);
    expect(await levels([a!, b!])).toEqual(
      new Map([
        [counterId(a!), { spentMicros: 0, reservedMicros: 0 }],
        [counterId(b!), { spentMicros: 3_000_000, reservedMicros: 0 }],
      ]),
    );
    // Decided again from what the counters hold now, it is written.
    expect((await writeLedgerIf(db, await levels([a!, b!]), changes, [], reservedAt, expiresAt)).ok).toBe(true);
    expect((await levels([a!])).get(counterId(a!))).toEqual({ spentMicros: 0, reservedMicros: 1_000_000 });
  });

  it('with bounds, writes over counters that moved but stay within them, and nothing over one past its bound', async () => {
    const [a, b] = await counters(fresh('cas-a'), fresh('cas-b'));
    const expected = await levels([a!, b!]);
    // Other replicas reserve and spend on both after the read.
    await sql`update budget_counters set reserved_units = reserved_units + 4, spent_units = spent_units + 1 where counter_key in (${a!.key}, ${b!.key})`.execute(
      db,
    );
    const changes = [{ ...a!, spentMicros: 0, reservedMicros: 1_000_000 }];
    const bounds = new Map([
      [counterId(a!), 5_000_000],
      [counterId(b!), null],
    ]);
    const written = await writeLedgerIf(db, expected, changes, [], reservedAt, expiresAt, undefined, bounds);
    expect(written.ok).toBe(true);
    // The levels it answers are those it left, not those it was decided from.
    expect(written.levels).toEqual(
      new Map([
        [counterId(a!), { spentMicros: 1_000_000, reservedMicros: 5_000_000 }],
        [counterId(b!), { spentMicros: 1_000_000, reservedMicros: 4_000_000 }],
      ]),
    );
    expect(await levels([a!, b!])).toEqual(written.levels);
    // a now holds 6 units: past its bound of 5, so the next write is refused whole.
    const refused = await writeLedgerIf(
      db,
      expected,
      [...changes, { ...b!, spentMicros: 0, reservedMicros: 1_000_000 }],
      [],
      reservedAt,
      expiresAt,
      undefined,
      bounds,
    );
    expect(refused).toEqual({ ok: false, budgetsHeld: true, levels: written.levels });
    expect(await levels([a!, b!])).toEqual(written.levels);
  });
});

describe('grants read ahead (the first step’s, while its run is claimed)', () => {
  const grants = () =>
    new GrantService({
      database: testDb.database,
      audit: new AuditLog(testDb.database, { now: () => clock.now() }),
      tools: {
        versions: () => [],
        resolve: () => ({ ok: false, code: 'tool_not_registered' }),
      },
      now: () => clock.now(),
    });
  const principal = (tenant: string): AgentPrincipal =>
    ({
      kind: 'agent',
      id: 'agent.batch',
      tenantId: tenant,
      family: 'batchers',
      scopes: new Set(['scf:read']),
    }) as unknown as AgentPrincipal;
  const runOf = (runId: string): StepRequest['run'] => ({ run_id: runId, context: {} });

  it('is used by the resolve of its own query, and a grant revoked after the read is still refused at the grant stage', async () => {
    const tenant = fresh('ahead-t');
    await claimOne(tenant, 'run-a');
    const granted = await grant({ tenant, scope: 'per-tenant', ref: tenant });
    const service = grants();
    const query = grantQueryOf(principal(tenant), runOf('run-a'), 'echo');
    const ahead = service.prefetch(query);
    await ahead.candidates;
    await revoke(granted.id);
    // The read ahead is what resolve judged (a fresh read finds the revocation)...
    expect(await service.resolve(query, ahead)).toMatchObject({ ok: true, grant: { id: granted.id } });
    expect(await service.resolve(query)).toMatchObject({ ok: false, code: 'grant_revoked' });
    // ...and the stage, which records the run's reliance on the grant, refuses it all the same.
    const ports = {
      grants: service,
      grantUses: new GrantUses(testDb.database, new Registry()),
    } as unknown as AdmissionPorts;
    const request: StepRequest = {
      principal: principal(tenant),
      run: runOf('run-a'),
      step: { index: 0, tool_id: 'echo', input: {} },
      dryRun: false,
      prefetchedGrants: ahead,
    };
    const state: StepState = { tool: { id: 'echo' } as AdmissibleTool, warnings: [] };
    expect(await grantStage.check(request, state, ports)).toMatchObject({ ok: false, code: 'grant_revoked' });
    expect(await db.selectFrom('run_grant_uses').select('grant_id').where('tenant_id', '=', tenant).execute()).toEqual(
      [],
    );
  });

  it('is ignored by the resolve of any other query', async () => {
    const tenant = fresh('ahead-t');
    const other = await grant({ tenant, tool: 'other', scope: 'per-run', ref: 'run-b' });
    const service = grants();
    const ahead = service.prefetch(grantQueryOf(principal(tenant), runOf('run-b'), 'echo'));
    expect(await service.resolve(grantQueryOf(principal(tenant), runOf('run-b'), 'other'), ahead)).toMatchObject({
      ok: true,
      grant: { id: other.id },
    });
    // The same subject in another run reads its own candidates: the per-run grant is not there.
    const elsewhere = service.prefetch(grantQueryOf(principal(tenant), runOf('run-b'), 'other'));
    expect(await service.resolve(grantQueryOf(principal(tenant), runOf('run-c'), 'other'), elsewhere)).toMatchObject({
      ok: false,
      code: 'grant_missing',
    });
  });
});

describe('an outcome record carrying its settlement and its run’s end', () => {
  let ledger: BudgetLedger;
  let rider: AppendRider<CallEnd, CallEndAnswer>;
  beforeAll(() => {
    ledger = newLedger();
    rider = callEndRider(ledger.settlements);
  });
  afterAll(async () => {
    await ledger.close();
  });

  const leave = (tenant: string, runId: string): RunEnding => ({
    tenant_id: tenant,
    run_id: runId,
    epoch: 1,
    status: 'completed',
    httpStatus: 200,
    envelope: envelope(runId, 'completed'),
  });
  const carrying = (tenant: string, runId: string, change: CallEnd, eventId?: string) => ({
    occurredAt: clock.now(),
    event: { event_type: 'run.step.completed', actor: 'agent:agent.batch', tenant_id: tenant, run_id: runId },
    ...(eventId ? { eventId } : {}),
    rides: change,
  });
  const reserve = async (tenant: string, runId: string, units: number) => {
    const result = await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId, units });
    if (!result.ok) throw new Error(`expected an admission, got ${JSON.stringify(result)}`);
    return result.reservation;
  };
  const usage = async (id: string) => {
    const u = (await getBudget(db, id, clock.now()))!;
    return { spent: u.spent_units, reserved: u.reserved_units };
  };
  const statusOf = async (id: string) =>
    (await db.selectFrom('budget_reservations').select('status').where('id', '=', id).executeTakeFirstOrThrow()).status;

  it('settles, ends the run and appends the record in one commit, and answers each', async () => {
    const tenant = fresh('ride-t');
    const budget = await monthly(tenant, 100);
    await claimOne(tenant, 'both');
    await claimOne(tenant, 'ends-only');
    const both = await reserve(tenant, 'both', 10);
    const settleOnly = await reserve(tenant, 'settle-only', 5);
    const closedBefore = await reserve(tenant, 'closed-before', 7);
    expect(await ledger.release(closedBefore)).toBe('released');
    const eventId = '00000000-0000-4000-8000-00000000ca11';
    const appended = await appendCarrying(
      db,
      [
        carrying(tenant, 'both', { end: leave(tenant, 'both'), closes: [settlementOf(both, 4)] }, eventId),
        carrying(tenant, 'settle-only', { closes: [settlementOf(settleOnly, 5)] }),
        carrying(tenant, 'ends-only', { end: leave(tenant, 'ends-only') }),
        carrying(tenant, 'closed-before', { closes: [settlementOf(closedBefore, 7)] }),
      ],
      rider,
    );
    expect(appended.answers).toEqual([
      { ended: true, closed: ['settled'] },
      { ended: false, closed: ['settled'] },
      { ended: true, closed: [] },
      { ended: false, closed: ['already_closed'] },
    ]);
    // Charged what the calls cost, nothing held: the released one is not charged again.
    expect(await usage(budget)).toEqual({ spent: 9, reserved: 0 });
    expect(await statusOf(closedBefore.id)).toBe('released');
    const xids = await sql<{ xid: string }>`
      select xmin::text as xid from audit_events where event_id = ${eventId}
      union all select xmin::text from runs where tenant_id = ${tenant} and run_id = 'both'
      union all select xmin::text from budget_reservations where id = ${both.id}
      union all select xmin::text from budget_counters where counter_key = ${budget}`.execute(db);
    expect(xids.rows).toHaveLength(4);
    expect(new Set(xids.rows.map((r) => r.xid)).size).toBe(1);
    // The ledger learned the level it left, so that its next reservation needs no read.
    const next = await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'next', units: 91 });
    expect(next.ok).toBe(true);
    expect((await ledger.reserve({ tenantId: tenant, agentId: 'agent.batch', runId: 'next', units: 1 })).ok).toBe(
      false,
    );
  });

  it('settles an expired reservation late, charged once', async () => {
    const tenant = fresh('ride-t');
    const budget = await monthly(tenant, 100);
    const expired = await reserve(tenant, 'expired', 10);
    await closeAndUncharge(db, [{ id: expired.id, status: 'expired', actualMicros: null }], clock.now());
    expect(await usage(budget)).toEqual({ spent: 0, reserved: 0 });
    const open = await reserve(tenant, 'open', 3);
    const appended = await appendCarrying(
      db,
      [
        carrying(tenant, 'expired', { closes: [settlementOf(expired, 2)] }),
        carrying(tenant, 'open', { closes: [settlementOf(open, 3)] }),
      ],
      rider,
    );
    expect(appended.answers).toEqual([
      { ended: false, closed: ['settled_after_expiry'] },
      { ended: false, closed: ['settled'] },
    ]);
    expect(await usage(budget)).toEqual({ spent: 5, reserved: 0 });
  });

  it('settles and ends inside a caller’s transaction as well', async () => {
    const tenant = fresh('ride-t');
    const budget = await monthly(tenant, 100);
    await claimOne(tenant, 'locked');
    const reservation = await reserve(tenant, 'locked', 6);
    const appended = await db
      .transaction()
      .execute((trx) =>
        appendCarrying(
          trx,
          [carrying(tenant, 'locked', { end: leave(tenant, 'locked'), closes: [settlementOf(reservation, 1.5)] })],
          rider,
        ),
      );
    expect(appended.answers).toEqual([{ ended: true, closed: ['settled'] }]);
    expect(await usage(budget)).toEqual({ spent: 1.5, reserved: 0 });
    expect((await findRun(db, tenant, 'locked'))!.status).toBe('completed');
    expect((await verifyAuditChain(db)).ok).toBe(true);
  });

  it.skipIf(!hasPostgresServer)(
    'leaves a reservation changed while it waited to be settled apart, and still appends the record (needs a PostgreSQL server)',
    async () => {
      const tenant = fresh('ride-t');
      const budget = await monthly(tenant, 100);
      const reservation = await reserve(tenant, 'changed', 8);
      const holder = new pg.Client({ connectionString: testDb.url! });
      const watcher = new pg.Client({ connectionString: testDb.url! });
      await holder.connect();
      await watcher.connect();
      try {
        // Another writer (a hand-off recharging it) holds the reservation and changes it.
        await holder.query('begin');
        await holder.query('update budget_reservations set charges = charges where id = $1', [reservation.id]);
        const appended = appendCarrying(
          db,
          [carrying(tenant, 'changed', { closes: [settlementOf(reservation, 8)] })],
          rider,
        );
        await until('the settlement to wait for the reservation', async () => (await lockWaits(watcher)) === 1);
        await holder.query('commit');
        const answer = await appended;
        expect(answer.answers).toEqual([{ ended: false, closed: [undefined] }]);
        expect(await statusOf(reservation.id)).toBe('reserved');
        expect(await ledger.settle(reservation, 8)).toBe('settled');
        expect(await usage(budget)).toEqual({ spent: 8, reserved: 0 });
      } finally {
        await holder.end();
        await watcher.end();
      }
    },
  );
});
