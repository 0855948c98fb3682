import { sql, type Kysely, type RawBuilder, type Selectable, type Transaction } from 'kysely';
import type { DB, RunTable } from '../db/schema.js';
import {
  grantStandsAsDecided,
  grantUseSteps,
  noGrantAtAll,
  type GrantUseIf,
} from '../grants/grant-snapshot-repository.js';
import { bucketStillAt, type BucketAt } from '../rate-limits/rate-bucket-repository.js';
import {
  isTerminal,
  OPEN_STATUSES,
  type Attribution,
  type RunEnvelope,
  type RunRequest,
  type RunStatus,
  type RunStop,
} from './run-types.js';
import type { ChainHeld } from '../db/lock-order.js';
import type { BudgetReservation, PreparedReservations, ReserveRequest } from '../budgets/budget-ledger.js';
import type { BudgetExceededDetails } from '../budgets/budget-verdict.js';

/** A run as stored: who owns it, where it got to, and what a resume or cascade needs of it. */
export interface RunRecord {
  tenant_id: string;
  run_id: string;
  agent_id: string;
  parent_run_id: string | null;
  pipeline_instance_id: string | null;
  session_id: string | null;
  user_id: string | null;
  status: RunStatus;
  /** null while a sub-run is `queued`: its agent has not sent its request yet. */
  request_sha256: string | null;
  http_status: number | null;
  envelope: RunEnvelope | null;
  created_at: string;
  updated_at: string;
  /** Kept while the run may go on (resume, recovery and cascades read it); dropped when its executor ends it. */
  request: RunRequest | null;
  agent_family: string | null;
  agent_scopes: string[];
  depth: number;
  /** The ancestors, root first. */
  lineage: Attribution[];
  budget_units: number | null;
  keep_open: boolean;
  epoch: number;
  busy: boolean;
  /** The replica whose executor holds the run while it is busy (null before migration 0009). */
  executor_id: string | null;
  stop: RunStop | null;
}

/** The key of a run: run ids are unique within a tenant. */
export interface RunKey {
  tenant_id: string;
  run_id: string;
}

/** What an executor taking a run up records about it and the agent it runs as. */
export interface RunStart {
  request_sha256: string;
  request: RunRequest;
  agent_family: string | undefined;
  agent_scopes: string[];
  keep_open: boolean;
}

/** A root run being claimed by its first request. */
export interface NewRun extends RunStart {
  tenant_id: string;
  run_id: string;
  agent_id: string;
  parent_run_id?: string | undefined;
  pipeline_instance_id?: string | undefined;
  session_id?: string | undefined;
  user_id?: string | undefined;
  trace_id: string;
  budget_units: number | undefined;
  /** Millisecond precision, so that list cursors (which carry it) are exact. */
  created_at: Date;
  /** The replica claiming it. */
  executor_id: string;
  /** The grant its first call was decided on from this replica's copy: recorded with the claim, if it still stands. */
  reliance?: GrantUseIf | undefined;
  /** What its first call is to be charged, for the claim to reserve with its grant use (see `ClaimCharges`). */
  charge?: ReserveRequest | undefined;
}

/** A run just claimed, whether the grant use it carried was recorded with it, and its first call's reservation if one was. */
export type ClaimedRun = RunRecord & {
  relied: boolean;
  reservation?: BudgetReservation | undefined;
  /** Its first call's budget refusal, decided before the claim and found exact by its statement. */
  refusal?: BudgetExceededDetails | undefined;
};

/** First calls' reservations a batch of claims writes too: only if every one of these runs is claimed relying on its grant. */
export interface ClaimCharges {
  runs: RunKey[];
  prepared: PreparedReservations;
}

type Db = Kysely<DB> | Transaction<DB>;

const unitsText = (units: number | null | undefined) =>
  units === null || units === undefined ? null : units.toFixed(6);

/**
 * Claims run ids for their first principal, as running runs their executors hold (`busy`), many
 * at once in one statement: for each new run, in order, its claimed record, or undefined when
 * its id was already taken (also by an earlier run of the same batch). Rows go in key order, so two replicas' batches wait for each other in one order.
 */
export async function claimRuns(
  db: Kysely<DB>,
  runs: NewRun[],
  charges?: ClaimCharges,
): Promise<Array<ClaimedRun | undefined>> {
  if (runs.length === 0) return [];
  const rows = [...runs]
    .sort((a, b) => (a.tenant_id === b.tenant_id ? compare(a.run_id, b.run_id) : compare(a.tenant_id, b.tenant_id)))
    .map((run, ord) => ({ ord, ...runRowOf(run) }));
  const uses = runs.flatMap((run) => (run.reliance ? [run.reliance] : []));
  const charged = uses.length > 0 ? charges : undefined;
  // The grants are share-locked before the counters, as every writer locks them.
  const ledger = charged
    ? sql`, ${charged.prepared.steps({
        when: sql`not exists (
            select 1 from unnest(${charged.runs.map((r) => r.tenant_id)}::text[], ${charged.runs.map((r) => r.run_id)}::text[]) as w(t, r)
            where not exists (select 1 from grant_uses_standing s where s.tenant_id = w.t and s.run_id = w.r))`,
        lockedFirst: sql`grant_uses_live`,
      })}`
    : sql``;
  const inserted = await sql<Selectable<RunTable> & { relied: boolean; charged: unknown }>`
    with claimed as (${claimInsert(sql`jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) as r(${runRowColumns})`, sql`*`)})${uses.length > 0 ? sql`, ${grantUseSteps(uses, 'claimed')}` : sql``}${ledger}
    select c.*, ${charged ? charged.prepared.outcome() : sql`null`} as charged, ${
      uses.length > 0
        ? sql`exists (select 1 from grant_uses_standing s where s.tenant_id = c.tenant_id and s.run_id = c.run_id)`
        : sql`false`
    } as relied
    from claimed c`.execute(db);
  const claimed = new Map(inserted.rows.map((row) => [keyOf(row), row]));
  // In the order of `charged.runs`, which `prepared` was decided for.
  const answered = charged?.prepared.written(inserted.rows[0]?.charged ?? null) ?? [];
  const answers = new Map(answered.map((answer, i) => [keyOf(charged!.runs[i]!), answer]));
  return runs.map((run) => {
    const key = keyOf(run);
    const row = claimed.get(key);
    // One claim per id: a second request for the same id in this batch finds it taken.
    claimed.delete(key);
    const answer = answers.get(key);
    answers.delete(key);
    return row
      ? {
          ...toRecord(row),
          relied: row.relied === true,
          reservation: answer?.ok ? answer.reservation : undefined,
          refusal: answer && !answer.ok ? answer.details : undefined,
        }
      : undefined;
  });
}

/** The run `claimRuns` would claim for `run`, as it would answer it: before it is written. */
export function unclaimedRecordOf(run: NewRun): RunRecord {
  const at = run.created_at.toISOString();
  return {
    tenant_id: run.tenant_id,
    run_id: run.run_id,
    agent_id: run.agent_id,
    parent_run_id: run.parent_run_id ?? null,
    pipeline_instance_id: run.pipeline_instance_id ?? null,
    session_id: run.session_id ?? null,
    user_id: run.user_id ?? null,
    status: 'running',
    request_sha256: run.request_sha256,
    http_status: null,
    envelope: null,
    created_at: at,
    updated_at: at,
    request: run.request,
    agent_family: run.agent_family ?? null,
    agent_scopes: run.agent_scopes,
    depth: 0,
    lineage: [],
    budget_units: run.budget_units ?? null,
    keep_open: run.keep_open,
    epoch: 1,
    busy: true,
    executor_id: run.executor_id,
    stop: null,
  };
}

/**
 * A root run created already ended by its first call's refusal, as its claim and its end would have left it; only if
 * its id is new and what the refusal was decided on from this replica's copies still stands: with `grantAbsent`, no
 * grant at all exists for that agent and tool; with `reliance`, the grant it was decided on still stands as decided;
 * with `bucket`, the bucket it was refused from holds that level still; with `budgetRefused`, the levels it was
 * refused on are still those (the statement's `budgetsHold`).
 */
export interface EndedRunStart {
  run: NewRun;
  end: Pick<RunEnding, 'status' | 'httpStatus' | 'envelope'>;
  grantAbsent?: { agent_id: string; tool_id: string } | undefined;
  reliance?: GrantUseIf | undefined;
  bucket?: BucketAt | undefined;
  budgetRefused?: ReserveRequest | undefined;
}

/**
 * `EndedRunStart`s as common table expressions another statement joins (a refusal's record): nothing
 * unless `when`; `run_starts_made` lists by `ord` (`ords`, else 1-based) those created, one per run id.
 * `budgetsHold` is the statement's word on the levels the `budgetRefused` ones were refused on.
 */
export function endedRunStartSteps(
  starts: EndedRunStart[],
  when: RawBuilder<unknown>,
  ords: number[] = starts.map((_, i) => i + 1),
  budgetsHold: RawBuilder<boolean> = sql<boolean>`false`,
): RawBuilder<unknown> {
  const rows = starts.map(({ run, end, grantAbsent, reliance, bucket, budgetRefused }, i) => ({
    ord: ords[i]!,
    ...runRowOf(run),
    status: end.status,
    http_status: end.httpStatus,
    envelope: end.envelope,
    // Kept while the run may go on, as an ended run's executor drops it (see `runEndSteps`).
    request: isTerminal(end.status) ? null : run.request,
    absent_agent: grantAbsent?.agent_id ?? null,
    absent_tool: grantAbsent?.tool_id ?? null,
    grant_id: reliance?.grant_id ?? null,
    agent_id: reliance?.assumed?.agent_id ?? null,
    tool_id: reliance?.assumed?.tool_id ?? null,
    since: reliance?.assumed?.since ?? null,
    decided_at: reliance?.assumed?.decided_at.toISOString() ?? null,
    bucket_agent: bucket?.agentId ?? null,
    bucket_tool: bucket?.toolId ?? null,
    bucket_tokens: bucket?.tokens ?? null,
    bucket_at: bucket ? new Date(bucket.updatedAtMs).toISOString() : null,
    budget_refused: budgetRefused !== undefined,
  }));
  return sql`run_starts as materialized (
      select * from jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) as r(
        ${runRowColumns}, status text, http_status integer, envelope jsonb, absent_agent text, absent_tool text,
        grant_id text, agent_id text, tool_id text, since bigint, decided_at timestamptz,
        bucket_agent text, bucket_tool text, bucket_tokens float8, bucket_at timestamptz, budget_refused boolean)
      where ${when}
        and (r.absent_tool is null or ${noGrantAtAll(sql`r.tenant_id`, sql`r.absent_agent`, sql`r.absent_tool`)})
        and (r.grant_id is null or ${grantStandsAsDecided(sql`r`)})
        and (r.bucket_tool is null or ${bucketStillAt(sql`r.tenant_id`, sql`r.bucket_agent`, sql`r.bucket_tool`, sql`r.bucket_tokens`, sql`r.bucket_at`)})
        and (not r.budget_refused or ${budgetsHold})
    ), run_starts_inserted as (
      insert into runs (tenant_id, run_id, owner_agent_id, parent_run_id, pipeline_instance_id, session_id, user_id,
                        status, request_sha256, trace_id, http_status, envelope, created_at, updated_at, request,
                        agent_family, agent_scopes, budget_units, keep_open, epoch, busy, executor_id)
      select tenant_id, run_id, owner_agent_id, parent_run_id, pipeline_instance_id, session_id, user_id,
             status, request_sha256, trace_id, http_status, envelope, created_at, now(), request,
             agent_family, agent_scopes, budget_units, keep_open, 1, false, executor_id
      from run_starts
      order by tenant_id, run_id, ord
      on conflict (tenant_id, run_id) do nothing
      returning tenant_id, run_id
    ), run_starts_made as (
      select min(s.ord) as ord from run_starts s
      join run_starts_inserted i on i.tenant_id = s.tenant_id and i.run_id = s.run_id
      group by s.tenant_id, s.run_id
    )`;
}

/**
 * A call whose intent record carries what its admission from the copies decided: a root run's first call claims its
 * run (`claim`), a later call of a run this executor holds finds it still running at its epoch (`held`); either
 * records the grant use it was decided on and writes its reservation. The record is appended only if all were
 * (see `claimedRunStartSteps`).
 */
export type ClaimedRunStart =
  { claim: NewRun & { reliance: GrantUseIf }; held?: undefined } | { held: HeldRunStep; claim?: undefined };

/** A later call of a run this executor holds, decided from the copies. */
export interface HeldRunStep extends RunKey {
  epoch: number;
  reliance: GrantUseIf;
  charge?: ReserveRequest | undefined;
}

/** What `claimedRunStartSteps` did for one run: as `claimRuns` answers a claim, and whether its record went with it. */
export interface ClaimedRunStartAnswer {
  /** Claimed; for a held run's call, found still running at its epoch. */
  claimed: boolean;
  /** Not claimed because its id was taken (by an earlier run, or one of the same batch). */
  taken?: boolean | undefined;
  relied: boolean;
  reservation?: BudgetReservation | undefined;
  refusal?: BudgetExceededDetails | undefined;
}

/**
 * `ClaimedRunStart`s as common table expressions of an append statement, nothing unless `when`: each run claimed as
 * `claimRuns` claims it, with its grant use and (all or none, as with a claim) the reservations `prepared` decided,
 * written under the prefix `claim_`. `claim_starts_made` lists by `ord` the runs that got all three (their records
 * are appended); `changed` says what was written, for `claimedRunStartsOf`. `ords` are the items' places in the
 * statement's guarded list.
 */
export function claimedRunStartSteps(
  starts: ClaimedRunStart[],
  ords: number[],
  prepared: PreparedReservations | undefined,
  when: RawBuilder<unknown>,
): { ctes: RawBuilder<unknown>; changed: RawBuilder<unknown> } {
  const rows = starts.map((start, i) => {
    const charge = start.claim ? start.claim.charge : start.held.charge;
    return {
      ...(start.claim
        ? { ...runRowOf(start.claim), held: false, epoch: 1 }
        : { tenant_id: start.held.tenant_id, run_id: start.held.run_id, held: true, epoch: start.held.epoch }),
      ord: ords[i]!,
      reservation_id: charge?.reservationId ?? null,
      // A charged call's record goes only with its reservation: without `prepared`, it is not appended.
      charged: charge !== undefined,
    };
  });
  const charged = starts.filter((start) => prepared && (start.claim ?? start.held).charge);
  const ledger = prepared
    ? sql`, ${prepared.steps({
        when: sql`not exists (
            select 1 from claim_starts w where w.charged
              and not exists (select 1 from grant_uses_standing s where s.tenant_id = w.tenant_id and s.run_id = w.run_id))`,
        lockedFirst: sql`grant_uses_live`,
        prefix: 'claim_',
      })}`
    : sql``;
  const ctes = sql`claim_starts as materialized (
      select * from jsonb_to_recordset(${JSON.stringify(rows)}::jsonb) as r(
        ${runRowColumns}, reservation_id text, charged boolean, held boolean, epoch integer)
      where ${when}
    ), claim_runs as (${claimInsert(sql`(select * from claim_starts where not held) s`, sql`tenant_id, run_id`)}
    ), claim_held as (
      -- Probed by key (a kept plan must not read a range of the open runs).
      select s.tenant_id, s.run_id from claim_starts s
      cross join lateral (
        select 1 from runs r
        where r.tenant_id = s.tenant_id and r.run_id = s.run_id and r.status = 'running' and r.epoch = s.epoch
        limit 1
      ) standing
      where s.held
    ), claim_ready as (
      select tenant_id, run_id from claim_runs union all select tenant_id, run_id from claim_held
    ), ${grantUseSteps(
      starts.map((start) => (start.claim ?? start.held).reliance),
      'claim_ready',
    )}${ledger}, claim_starts_claimed as materialized (
      select min(s.ord) as ord, bool_or(exists (
               select 1 from grant_uses_standing g where g.tenant_id = s.tenant_id and g.run_id = s.run_id)) as relied
      from claim_starts s join claim_ready c on c.tenant_id = s.tenant_id and c.run_id = s.run_id
      group by s.tenant_id, s.run_id
    ), claim_starts_made as (
      select c.ord from claim_starts_claimed c join claim_starts s on s.ord = c.ord
      where c.relied and (not s.charged${prepared ? sql` or s.reservation_id in (select id from claim_ledger)` : sql``})
    )`;
  const changed = sql`json_build_object(
      'claimed', (select coalesce(json_agg(json_build_array(ord, relied)), '[]') from claim_starts_claimed),
      'ledger', ${charged.length > 0 ? prepared!.outcome('claim_') : sql`null`})`;
  return { ctes, changed };
}

/**
 * Each start's answer from what `claimedRunStartSteps` answered (`changed`), and the ledger's answer to `prepared`
 * (which `written` remembers).
 */
export function claimedRunStartsOf(
  starts: ClaimedRunStart[],
  ords: number[],
  prepared: PreparedReservations | undefined,
  changed: unknown,
): ClaimedRunStartAnswer[] {
  const row = (changed ?? {}) as { claimed?: Array<[number, boolean]>; ledger?: unknown };
  const claimed = new Map((row.claimed ?? []).map(([ord, relied]) => [Number(ord), relied === true]));
  const chargedOnes = starts.filter((start) => prepared && (start.claim ?? start.held).charge);
  const written = chargedOnes.length > 0 ? prepared!.written(row.ledger ?? null) : undefined;
  const results = new Map(chargedOnes.map((start, i) => [start, written?.[i]]));
  return starts.map((start, i) => {
    const ord = ords[i]!;
    if (!claimed.has(ord)) return { claimed: false, taken: start.claim !== undefined, relied: false };
    const result = results.get(start);
    return {
      claimed: true,
      relied: claimed.get(ord)!,
      reservation: result?.ok ? result.reservation : undefined,
      refusal: result && !result.ok ? result.details : undefined,
    };
  });
}

/** The columns of `runRowOf`'s rows with their `ord`, as a `jsonb_to_recordset` column definition list. */
const runRowColumns = sql.raw(`ord integer, tenant_id text, run_id text, owner_agent_id text, parent_run_id text,
  pipeline_instance_id text, session_id text, user_id text, request_sha256 text, trace_id text, created_at timestamptz,
  request jsonb, agent_family text, agent_scopes text[], budget_units numeric, keep_open boolean, executor_id text`);

/** Inserts the runs of `source` (rows of `runRowOf` with their `ord`) as claimed: running, held by their executors, in key order. */
function claimInsert(source: RawBuilder<unknown>, returning: RawBuilder<unknown>): RawBuilder<unknown> {
  return sql`insert into runs (tenant_id, run_id, owner_agent_id, parent_run_id, pipeline_instance_id, session_id, user_id,
                      status, request_sha256, trace_id, envelope, created_at, updated_at, request, agent_family,
                      agent_scopes, budget_units, keep_open, epoch, busy, executor_id)
    select tenant_id, run_id, owner_agent_id, parent_run_id, pipeline_instance_id, session_id, user_id,
           'running', request_sha256, trace_id, null, created_at, created_at, request, agent_family,
           agent_scopes, budget_units, keep_open, 1, true, executor_id
    from ${source}
    order by tenant_id, run_id, ord
    on conflict (tenant_id, run_id) do nothing
    returning ${returning}`;
}

/** A run's columns as its claim writes them (JSON, for `jsonb_to_recordset`). */
function runRowOf(run: NewRun) {
  return {
    tenant_id: run.tenant_id,
    run_id: run.run_id,
    owner_agent_id: run.agent_id,
    parent_run_id: run.parent_run_id ?? null,
    pipeline_instance_id: run.pipeline_instance_id ?? null,
    session_id: run.session_id ?? null,
    user_id: run.user_id ?? null,
    request_sha256: run.request_sha256,
    trace_id: run.trace_id,
    created_at: run.created_at.toISOString(),
    request: run.request,
    agent_family: run.agent_family ?? null,
    agent_scopes: run.agent_scopes,
    budget_units: unitsText(run.budget_units),
    keep_open: run.keep_open,
    executor_id: run.executor_id,
  };
}

function keyOf(run: RunKey): string {
  return `${run.tenant_id}\u0000${run.run_id}`;
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * A sub-run created by a hand-off, `queued` (or `awaiting_approval` of the hand-off), owned by
 * the sub-agent, with the lineage and budget the hand-off gives it.
 */
export async function insertSubRun(
  trx: Transaction<DB>,
  run: RunKey & {
    agent_id: string;
    parent_run_id: string;
    status: 'queued' | 'awaiting_approval';
    depth: number;
    lineage: Attribution[];
    budget_units: number;
    trace_id: string | null;
    created_at: Date;
  },
): Promise<RunRecord | undefined> {
  const row = await trx
    .insertInto('runs')
    .values({
      tenant_id: run.tenant_id,
      run_id: run.run_id,
      owner_agent_id: run.agent_id,
      parent_run_id: run.parent_run_id,
      pipeline_instance_id: null,
      session_id: null,
      user_id: null,
      status: run.status,
      request_sha256: null,
      trace_id: run.trace_id,
      envelope: null,
      created_at: run.created_at,
      updated_at: run.created_at,
      depth: run.depth,
      lineage: JSON.stringify(run.lineage),
      budget_units: unitsText(run.budget_units),
      busy: false,
    })
    .onConflict((oc) => oc.columns(['tenant_id', 'run_id']).doNothing())
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Marks a parent run (locked by the caller) as just handed off, a new row version: a run end batched meanwhile, whose
 * snapshot predates the sub-run, finds the row changed and leaves the parent to be ended under the lock.
 */
export async function markHandedOff(trx: Transaction<DB>, key: RunKey): Promise<void> {
  await trx
    .updateTable('runs')
    .set({ updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .execute();
}

/**
 * Takes a throttled run back to `running` for its owner's identical resubmission. Only one
 * caller wins when several race; the others see `undefined`.
 */
export async function resumeThrottledRun(
  db: Kysely<DB>,
  key: { tenant_id: string; run_id: string; agent_id: string; request_sha256: string },
  executorId: string,
): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({
      status: 'running',
      busy: true,
      executor_id: executorId,
      epoch: sql<number>`epoch + 1`,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('owner_agent_id', '=', key.agent_id)
    .where('request_sha256', '=', key.request_sha256)
    .where('status', '=', 'throttled')
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Starts a queued sub-run with its agent's first request; `budget_units` only ever lowers the
 * hand-off's. Only one caller wins when several race.
 */
export async function startQueuedRun(
  db: Kysely<DB>,
  key: RunKey & { agent_id: string },
  start: RunStart & {
    budget_units: number | undefined;
    pipeline_instance_id?: string | undefined;
    session_id?: string | undefined;
    user_id?: string | undefined;
  },
  executorId: string,
): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({
      status: 'running',
      busy: true,
      executor_id: executorId,
      epoch: sql<number>`epoch + 1`,
      request_sha256: start.request_sha256,
      request: JSON.stringify(start.request),
      agent_family: start.agent_family ?? null,
      agent_scopes: start.agent_scopes,
      keep_open: start.keep_open,
      pipeline_instance_id: start.pipeline_instance_id ?? null,
      session_id: start.session_id ?? null,
      user_id: start.user_id ?? null,
      ...(start.budget_units !== undefined
        ? { budget_units: sql<string>`least(budget_units, ${unitsText(start.budget_units)}::numeric)` }
        : {}),
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('owner_agent_id', '=', key.agent_id)
    .where('status', '=', 'queued')
    .where('busy', '=', false)
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Takes an idle run in one of `from` up for an executor: `running`, a new epoch, busy. Only one
 * caller wins when several race.
 */
export async function claimIdleRun(
  db: Db,
  key: RunKey,
  from: readonly RunStatus[],
  executorId: string,
): Promise<RunRecord | undefined> {
  const row = await db
    .updateTable('runs')
    .set({
      status: 'running',
      busy: true,
      executor_id: executorId,
      epoch: sql<number>`epoch + 1`,
      updated_at: sql<Date>`now()`,
    })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('status', 'in', [...from])
    .where('busy', '=', false)
    .returningAll()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * An executor letting go of a run: stores where it got to and clears `busy`. With `status`, also
 * moves the run from `running` to it. Only the executor of the current epoch can do either;
 * `undefined` when the run moved on without it (its status is then someone else's to set).
 */
export async function releaseRun(
  db: Db,
  key: RunKey & { epoch: number },
  change: { status?: RunStatus; httpStatus: number; envelope: RunEnvelope },
): Promise<RunRecord | undefined> {
  let update = db
    .updateTable('runs')
    .set({
      ...(change.status !== undefined ? { status: change.status } : {}),
      ...(change.status !== undefined && isTerminal(change.status) ? { request: null } : {}),
      http_status: change.httpStatus,
      envelope: JSON.stringify(change.envelope),
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
    tenant_id: l.tenant_id,
    run_id: l.run_id,
    epoch: l.epoch,
    status: l.status,
    http_status: l.httpStatus,
    envelope: l.envelope,
  }));
  const when = options.when ?? sql`true`;
  const lock = options.waitForLocks ? sql`for no key update` : sql`for no key update skip locked`;
  return sql`run_ends as materialized (
      select * from jsonb_to_recordset(${JSON.stringify(rows)}::jsonb)
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

/** The part of a run an executor re-reads at every call boundary. */
export async function readRunStanding(
  db: Kysely<DB>,
  key: RunKey,
): Promise<Pick<RunRecord, 'status' | 'epoch' | 'stop'> | undefined> {
  const row = await db
    .selectFrom('runs')
    .select(['status', 'epoch', 'stop'])
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .executeTakeFirst();
  return row ? { status: row.status as RunStatus, epoch: row.epoch, stop: parseJson<RunStop>(row.stop) } : undefined;
}

/**
 * `readRunStanding` once every transaction changing the run has committed: the row is
 * share-locked for the read, so a control or cascade holding it (which may have closed the run's
 * hand-off already) is waited for, not read around.
 */
export async function readRunStandingSettled(
  db: Kysely<DB>,
  key: RunKey,
): Promise<Pick<RunRecord, 'status' | 'epoch' | 'stop'> | undefined> {
  const row = await db
    .selectFrom('runs')
    .select(['status', 'epoch', 'stop'])
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .forShare()
    .executeTakeFirst();
  return row ? { status: row.status as RunStatus, epoch: row.epoch, stop: parseJson<RunStop>(row.stop) } : undefined;
}

/** A run by its key, unlocked. */
export async function findRun(db: Db, tenantId: string, runId: string): Promise<RunRecord | undefined> {
  const row = await db
    .selectFrom('runs')
    .selectAll()
    .where('tenant_id', '=', tenantId)
    .where('run_id', '=', runId)
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Locks one run for the rest of the transaction. `FOR NO KEY UPDATE`: rows that reference the
 * run (grant uses, hand-offs, approvals) can still be added meanwhile.
 */
export async function lockRun(trx: ChainHeld, key: RunKey): Promise<RunRecord | undefined> {
  const row = await trx
    .selectFrom('runs')
    .selectAll()
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .forNoKeyUpdate()
    .executeTakeFirst();
  return row ? toRecord(row) : undefined;
}

/**
 * Locks the open runs among `roots` and all their open descendants (sub-runs, transitively), in
 * one stable order. A hand-off locks its parent before adding a sub-run, so none can slip in.
 */
export async function lockOpenRunTrees(trx: ChainHeld, roots: RunKey[]): Promise<RunRecord[]> {
  if (roots.length === 0) return [];
  const result = await sql<{ tenant_id: string; run_id: string }>`
    with recursive tree(tenant_id, run_id) as (
      select r.tenant_id, r.run_id from runs r
      join unnest(${roots.map((k) => k.tenant_id)}::text[], ${roots.map((k) => k.run_id)}::text[]) as k(t, id)
        on r.tenant_id = k.t and r.run_id = k.id
      union
      select c.tenant_id, c.run_id from runs c join tree p on c.tenant_id = p.tenant_id and c.parent_run_id = p.run_id
      where c.status = any(${[...OPEN_STATUSES]}::text[])
    )
    select tenant_id, run_id from tree
  `.execute(trx);
  if (result.rows.length === 0) return [];
  const rows = await trx
    .selectFrom('runs')
    .selectAll()
    .where((eb) =>
      eb.or(result.rows.map((k) => eb.and([eb('tenant_id', '=', k.tenant_id), eb('run_id', '=', k.run_id)]))),
    )
    .where('status', 'in', [...OPEN_STATUSES])
    .orderBy('tenant_id')
    .orderBy('run_id')
    .forNoKeyUpdate()
    .execute();
  return rows.map(toRecord);
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

/** Moves a run that waited for its hand-off's approval to `queued`. */
export async function releaseApprovedSubRun(trx: Transaction<DB>, key: RunKey): Promise<boolean> {
  const row = await trx
    .updateTable('runs')
    .set({ status: 'queued', updated_at: sql<Date>`now()` })
    .where('tenant_id', '=', key.tenant_id)
    .where('run_id', '=', key.run_id)
    .where('status', '=', 'awaiting_approval')
    .where('request_sha256', 'is', null)
    .returning('run_id')
    .executeTakeFirst();
  return row !== undefined;
}

/**
 * A tenant's open runs that relied on any of these grants (the tenant's own). Driven by the open runs, each probed
 * for a use by key: a grant's uses grow with history, its tenant's open runs do not.
 */
export async function findOpenRunsUsingGrants(
  trx: Transaction<DB>,
  tenantId: string,
  grantIds: string[],
): Promise<RunKey[]> {
  if (grantIds.length === 0) return [];
  // The statuses as literals, so that `runs_open`'s predicate is provably implied whatever the plan.
  const open = sql.join(OPEN_STATUSES.map((status) => sql.lit(status)));
  const result = await sql<RunKey>`
    select r.tenant_id, r.run_id from runs r
    cross join lateral (
      select 1 from run_grant_uses u
      where u.grant_id = any(${grantIds}::text[]) and u.tenant_id = r.tenant_id and u.run_id = r.run_id
      limit 1
    ) used
    where r.tenant_id = ${tenantId} and r.status in (${open})`.execute(trx);
  return result.rows;
}

/** Open runs of one tenant, or of every tenant (`null`). */
export async function listOpenRuns(trx: Transaction<DB>, tenantId: string | null): Promise<RunRecord[]> {
  let q = trx
    .selectFrom('runs')
    .selectAll()
    .where('status', 'in', [...OPEN_STATUSES]);
  if (tenantId !== null) q = q.where('tenant_id', '=', tenantId);
  const rows = await q.execute();
  return rows.map(toRecord);
}

/** A busy run and the replica holding it. */
export interface BusyRun extends RunKey {
  executor_id: string;
}

/**
 * Busy runs that may be lost, a page at a time in key order (after `after`): held by this
 * replica (`selfId`; the caller knows which of those it still executes), or by a replica whose
 * lease has passed or that is gone.
 */
export async function findBusyRunsToCheck(
  db: Kysely<DB>,
  selfId: string,
  limit: number,
  after?: RunKey,
): Promise<BusyRun[]> {
  let q = db
    .selectFrom('runs as r')
    .select(['r.tenant_id', 'r.run_id', 'r.executor_id'])
    .where('r.busy', '=', true)
    .where('r.executor_id', 'is not', null);
  if (after) q = q.where(sql<boolean>`(r.tenant_id, r.run_id) > (${after.tenant_id}, ${after.run_id})`);
  const rows = await q
    .where((eb) =>
      eb.or([
        eb('r.executor_id', '=', selfId),
        eb.not(
          eb.exists(
            eb
              .selectFrom('replicas as p')
              .select('p.id')
              .whereRef('p.id', '=', 'r.executor_id')
              .where('p.expires_at', '>', sql<Date>`now()`),
          ),
        ),
      ]),
    )
    .orderBy('r.tenant_id')
    .orderBy('r.run_id')
    .limit(limit)
    .execute();
  return rows.map((row) => ({ tenant_id: row.tenant_id, run_id: row.run_id, executor_id: row.executor_id! }));
}

/** Whether a replica's lease still holds (database time). */
export async function replicaAlive(db: Db, replicaId: string): Promise<boolean> {
  const row = await db
    .selectFrom('replicas')
    .select('id')
    .where('id', '=', replicaId)
    .where('expires_at', '>', sql<Date>`now()`)
    .executeTakeFirst();
  return row !== undefined;
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

/** A page of `GET /runs`. */
export interface RunQuery {
  tenantId?: string | undefined;
  agentId?: string | undefined;
  status?: RunStatus | undefined;
  after?: { created_at: string; tenant_id: string; run_id: string } | undefined;
  limit: number;
}

/** Newest first; `next` continues the listing when more remain. */
export async function listRuns(
  db: Kysely<DB>,
  query: RunQuery,
): Promise<{ items: RunRecord[]; next: RunQuery['after'] | null }> {
  let q = db.selectFrom('runs').selectAll();
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.agentId !== undefined) q = q.where('owner_agent_id', '=', query.agentId);
  if (query.status !== undefined) q = q.where('status', '=', query.status);
  if (query.after) {
    const { created_at, tenant_id, run_id } = query.after;
    q = q.where(sql<boolean>`(created_at, tenant_id, run_id) < (${new Date(created_at)}, ${tenant_id}, ${run_id})`);
  }
  const rows = await q
    .orderBy('created_at', 'desc')
    .orderBy('tenant_id', 'desc')
    .orderBy('run_id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toRecord);
  const last = items[items.length - 1];
  return {
    items,
    next:
      rows.length > query.limit && last
        ? { created_at: last.created_at, tenant_id: last.tenant_id, run_id: last.run_id }
        : null,
  };
}

function parseJson<T>(value: unknown): T | null {
  if (value === null || value === undefined) return null;
  return (typeof value === 'string' ? JSON.parse(value) : value) as T;
}

function toRecord(row: Selectable<RunTable>): RunRecord {
  return {
    tenant_id: row.tenant_id,
    run_id: row.run_id,
    agent_id: row.owner_agent_id,
    parent_run_id: row.parent_run_id,
    pipeline_instance_id: row.pipeline_instance_id,
    session_id: row.session_id,
    user_id: row.user_id,
    status: row.status as RunStatus,
    request_sha256: row.request_sha256,
    http_status: row.http_status,
    envelope: parseJson<RunEnvelope>(row.envelope),
    created_at: new Date(row.created_at).toISOString(),
    updated_at: new Date(row.updated_at).toISOString(),
    request: parseJson<RunRequest>(row.request),
    agent_family: row.agent_family,
    agent_scopes: row.agent_scopes ?? [],
    depth: row.depth,
    lineage: parseJson<Attribution[]>(row.lineage) ?? [],
    budget_units: row.budget_units === null ? null : Number(row.budget_units),
    keep_open: row.keep_open,
    epoch: row.epoch,
    busy: row.busy,
    executor_id: row.executor_id,
    stop: parseJson<RunStop>(row.stop),
  };
}
