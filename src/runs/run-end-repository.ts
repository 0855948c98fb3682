import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { isTerminal, type RunEnvelope, type RunStatus, type RunStop } from './run-types.js';
import { rowsJsonWith, toRecord, type Db, type RunKey, type RunRecord } from './run-repository.js';

/**
 * An executor letting go of a run: stores where it got to and clears `busy`. With `status`, also
 * moves the run from `running` to it. Only the executor of the current epoch can do either;
 * `undefined` when the run moved on without it (its status is then someone else's to set).
 */
export async function releaseRun(
  db: Db,
  key: RunKey & { epoch: number },
  change: { status?: RunStatus; httpStatus: number; envelope: RunEnvelope; envelopeJson?: string | undefined },
): Promise<RunRecord | undefined> {
  let update = db
    .updateTable('runs')
    .set({
      ...(change.status !== undefined ? { status: change.status } : {}),
      ...(change.status !== undefined && isTerminal(change.status) ? { request: null } : {}),
      http_status: change.httpStatus,
      envelope: change.envelopeJson ?? JSON.stringify(change.envelope),
      busy: false,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('epoch', '=', key.epoch);
  if (change.status !== undefined) update = update.where('status', '=', 'running');
  const row = await update.returningAll().executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/** An executor ending a run it holds (see `releaseRun`). */
export interface RunEnding extends RunKey {
  epoch: number;
  status: RunStatus;
  httpStatus: number;
  envelope: RunEnvelope;
  /** The envelope's JSON when it was made already (for the size check and the reply): stored as it is. */
  envelopeJson?: string | undefined;
}

/**
 * Ends many runs that never handed off, in one statement: for each, whether it ended (false when
 * the run moved on without its executor, or has a sub-run and must end under the audit chain's
 * lock). The runs are locked in key order first, as controls and cascades lock them.
 */
export async function endRuns(db: Kysely<DB>, endings: RunEnding[]): Promise<boolean[]> {
  if (endings.length === 0) return [];
  const result =
    await sql<EndedRunRow>`with ${runEndSteps(endings, { waitForLocks: true })} select * from run_ends_done`.execute(
      db,
    );
  return endedOf(endings, result.rows);
}

/** A run a run-end statement ended. */
export interface EndedRunRow {
  tenant_id: string;
  run_id: string;
  epoch: number;
}

/**
 * CTEs ending in `run_ends_done`, joined by `when` to their statement; `waitForLocks: false` skips held rows, a row
 * changed since the snapshot is left to the caller. Keyed: docs/design/database-pools.md#why-two-kinds-of-planning.
 */
export function runEndSteps(
  endings: RunEnding[],
  options: { waitForLocks: boolean; when?: RawBuilder<unknown> },
): RawBuilder<unknown> {
  const rows = endings.map((l) => ({
    row: { tenant_id: l.tenant_id, run_id: l.run_id, epoch: l.epoch, status: l.status, http_status: l.httpStatus },
    with: { envelope: l.envelopeJson ?? JSON.stringify(l.envelope) },
  }));
  const when = options.when ?? sql`true`;
  const lock = options.waitForLocks ? sql`for no key update` : sql`for no key update skip locked`;
  return sql`run_ends as materialized (
      select * from jsonb_to_recordset(${rowsJsonWith(rows)}::jsonb)
        as v(tenant_id text, run_id text, epoch integer, status text, http_status integer, envelope jsonb)
      where ${when}
      -- In the server's key order (its collation, not JavaScript's): the probes lock in this order.
      order by tenant_id, run_id
    ), run_ends_locked as materialized (
      select l.row_version, v.* from run_ends v
      cross join lateral (
        select r.ctid as row_version from runs r
        where r.tenant_id = v.tenant_id and r.run_id = v.run_id and r.status = 'running' and r.epoch = v.epoch
        limit 1
        ${lock}
      ) l
      where not exists (select 1 from runs sub where sub.tenant_id = v.tenant_id and sub.parent_run_id = v.run_id)
    ), run_ends_done as (
      update runs r
      set status = l.status, http_status = l.http_status, envelope = l.envelope, busy = false, updated_at = now(),
          request = case when l.status in ('completed', 'failed', 'cancelled', 'killed') then null else r.request end
      from run_ends_locked l
      where r.ctid = l.row_version and r.status = 'running' and r.epoch = l.epoch
      returning r.tenant_id, r.run_id, l.epoch
    )`;
}

/** For each leave, whether the statement ended its run (keyed by epoch too: only the executor of the run's current epoch ends it). */
export function endedOf(endings: RunEnding[], rows: EndedRunRow[]): boolean[] {
  const left = new Set(rows.map((row) => `${row.tenant_id}\u0000${row.run_id}\u0000${row.epoch}`));
  return endings.map((l) => left.has(`${l.tenant_id}\u0000${l.run_id}\u0000${l.epoch}`));
}

/** Sets what a control or cascade decided for a run it holds locked. */
export async function writeRunEnd(
  trx: Transaction<DB>,
  key: RunKey,
  end: { status: RunStatus; stop: RunStop | null; httpStatus: number; envelope: RunEnvelope | null },
): Promise<void> {
  await trx
    .updateTable('runs')
    .set({
      status: end.status,
      stop: end.stop === null ? null : JSON.stringify(end.stop),
      http_status: end.httpStatus,
      envelope: end.envelope === null ? null : JSON.stringify(end.envelope),
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}

/** Moves an idle or running run to `paused` (a running one's executor stops at its next call). */
export async function writeRunPaused(trx: Transaction<DB>, key: RunKey, envelope: RunEnvelope | null): Promise<void> {
  await trx
    .updateTable('runs')
    .set({
      status: 'paused',
      ...(envelope ? { envelope: JSON.stringify(envelope), http_status: 202 } : {}),
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}

/** Puts a paused run that nothing executes back to waiting for an operator's approval. */
export async function writeRunAwaitingApproval(
  trx: Transaction<DB>,
  key: RunKey,
  envelope: RunEnvelope,
): Promise<void> {
  await trx
    .updateTable('runs')
    .set({
      status: 'awaiting_approval',
      envelope: JSON.stringify(envelope),
      http_status: 202,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}

/** Sets the status of a run the caller holds locked and nothing executes. */
export async function writeRunStatus(trx: Transaction<DB>, key: RunKey, status: RunStatus): Promise<void> {
  await trx
    .updateTable('runs')
    .set({ status, updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}

/**
 * Lets go of a lost run the caller holds locked: what is known of it, no longer busy, and a new
 * epoch, so that its executor, should it come back after all, changes nothing more.
 */
export async function releaseLostRun(
  trx: Transaction<DB>,
  key: RunKey,
  change: { httpStatus: number; envelope: RunEnvelope },
): Promise<void> {
  await trx
    .updateTable('runs')
    .set({
      http_status: change.httpStatus,
      envelope: JSON.stringify(change.envelope),
      busy: false,
      epoch: sql<number>`epoch + 1`,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}
