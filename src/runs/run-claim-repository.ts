import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, RunTable } from '../db/schema.js';
import {
  grantStandsAsDecided,
  grantUseSteps,
  noGrantAtAll,
  type GrantUseIf,
} from '../grants/grant-snapshot-repository.js';
import { bucketStillAt, type BucketAt } from '../rate-limits/rate-bucket-repository.js';
import { isTerminal } from './run-types.js';
import type { BudgetReservation, PreparedReservations, ReserveRequest } from '../budgets/budget-reservation.js';
import type { BudgetExceededDetails } from '../budgets/budget-verdict.js';
import { rowsJsonWith, toRecord, unitsText, type RunKey, type RunRecord, type RunStart } from './run-repository.js';
import type { RunEnding } from './run-end-repository.js';

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
    .map((run, ord) => ({ row: { ord, ...runRowOf(run) }, with: { request: requestJsonOf(run) } }));
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
    with claimed as (${claimInsert(sql`jsonb_to_recordset(${rowsJsonWith(rows)}::jsonb) as r(${runRowColumns})`, sql`*`)})${uses.length > 0 ? sql`, ${grantUseSteps(uses, 'claimed')}` : sql``}${ledger}
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
  end: Pick<RunEnding, 'status' | 'httpStatus' | 'envelope' | 'envelopeJson'>;
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
    with: {
      // Kept while the run may go on, as an ended run's executor drops it (see `runEndSteps`).
      request: isTerminal(end.status) ? null : requestJsonOf(run),
      envelope: end.envelopeJson ?? JSON.stringify(end.envelope),
    },
    row: {
      ord: ords[i]!,
      ...runRowOf(run),
      status: end.status,
      http_status: end.httpStatus,
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
    },
  }));
  return sql`run_starts as materialized (
      select * from jsonb_to_recordset(${rowsJsonWith(rows)}::jsonb) as r(
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
      with: { request: start.claim ? requestJsonOf(start.claim) : null },
      row: {
        ...(start.claim
          ? { ...runRowOf(start.claim), held: false, epoch: 1 }
          : { tenant_id: start.held.tenant_id, run_id: start.held.run_id, held: true, epoch: start.held.epoch }),
        ord: ords[i]!,
        reservation_id: charge?.reservationId ?? null,
        // A charged call's record goes only with its reservation: without `prepared`, it is not appended.
        charged: charge !== undefined,
      },
    };
  });
  const charged = starts.filter((start) => prepared && (start.claim ?? start.held).charge);
  const ledger = prepared
    ? sql`, ${prepared.steps({
        // Nothing unless the statement's `when`: with no start claimed, the check below would hold vacuously.
        when: sql`(${when}) and not exists (
            select 1 from claim_starts w where w.charged
              and not exists (select 1 from grant_uses_standing s where s.tenant_id = w.tenant_id and s.run_id = w.run_id))`,
        lockedFirst: sql`grant_uses_live`,
        prefix: 'claim_',
      })}`
    : sql``;
  const ctes = sql`claim_starts as materialized (
      select * from jsonb_to_recordset(${rowsJsonWith(rows)}::jsonb) as r(
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

/** A run's columns as its claim writes them (JSON, for `jsonb_to_recordset`), but its request (`requestJsonOf`). */
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
    agent_family: run.agent_family ?? null,
    agent_scopes: run.agent_scopes,
    budget_units: unitsText(run.budget_units),
    keep_open: run.keep_open,
    executor_id: run.executor_id,
  };
}

/** The request a run's row stores: the canonical JSON its hash was made from, when the caller has it. */
function requestJsonOf(run: RunStart): string {
  return run.requestJson ?? JSON.stringify(run.request);
}

function keyOf(run: RunKey): string {
  return `${run.tenant_id}\u0000${run.run_id}`;
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
