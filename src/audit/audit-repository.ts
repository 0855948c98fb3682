import { randomUUID } from 'node:crypto';
import { sql, type Kysely, type RawBuilder, type Selectable, type Transaction } from 'kysely';
import type { AuditEventTable, DB } from '../db/schema.js';
import { OPTIONAL_FIELDS, type AuditEventInput, type AuditRecord } from './audit-event.js';
import { GENESIS_HASH, HASH_SCHEME, sealContent, type AuditContent } from './audit-hash.js';
import { walkChain, type ArchivedRange, type WalkResult } from './chain-walk.js';

export interface TimedAuditEvent<T = unknown, G = unknown> {
  event: AuditEventInput;
  occurredAt: Date;
  /** The record's id, when the caller had to name it before the append (see `rides`). */
  eventId?: string;
  /** A change that commits with this event and only if it does (see `AppendRider`). */
  rides?: T;
  /** A change without which this event is not appended at all (see `AppendGuard`); not with `rides`. */
  onlyIf?: G;
}

/**
 * A change to other rows that commits with an append, and only if the append does (a run's end,
 * a reservation's settlement): audit carries its SQL without knowing what it changes, so it
 * depends on no room above it. `R` is what each change answers (whether it was applied, how).
 */
export interface AppendRider<T, R = boolean> {
  /**
   * Common table expressions joined to the append statement, changing nothing unless `when`, and a
   * JSON value of what they changed, as `answers` reads it.
   */
  steps(items: T[], when: RawBuilder<unknown>): { ctes: RawBuilder<unknown>; changed: RawBuilder<unknown> };
  /** For each item, its answer from what the steps changed. */
  answers(items: T[], changed: unknown): R[];
}

/**
 * A change an event is appended only with (a run created with its first record): made in the append
 * statement after the chain head is locked, and the event is numbered and linked only if it was
 * made. So a batch's records may be dropped one by one, and the chain stays gapless.
 */
export interface AppendGuard<G, A = unknown> {
  /**
   * Common table expressions that make each item's change, changing nothing unless `when`; the
   * name of the one among them whose `ord` column lists the items (1-based) that were made; and
   * optionally a JSON value of what they did, as `answers` reads it.
   */
  steps(
    items: G[],
    when: RawBuilder<unknown>,
  ): { ctes: RawBuilder<unknown>; made: string; changed?: RawBuilder<unknown> };
  /** For each item, its answer from what the steps did (whether its record was appended or not). */
  answers?(items: G[], changed: unknown): A[];
}

/**
 * Appended records (those of guarded events only if their change was made: `appended` says which),
 * and for each event that carried a change or a guard with answers, its answer (undefined for the others).
 */
export interface Appended<R = unknown> {
  records: AuditRecord[];
  /** The head the statement found and linked after (what the chain held before these records); none without events. */
  after?: ChainHead | undefined;
  appended: boolean[];
  answers: Array<R | undefined>;
}

/** The last link of the chain: what the next event's `prev_hash` and `seq` follow. */
export interface ChainHead {
  seq: number;
  hash: string;
}

/** The columns of `audit_events` that hold SHA-256s, as their 32 bytes since migration 0022. */
type HashColumn = 'prev_hash' | 'hash' | 'input_sha256' | 'output_sha256';

/** A hash column as the lowercase hex the rest of toolgate speaks (a null stays null). */
export function hexOf<C extends HashColumn>(column: C): RawBuilder<AuditRecord[C]> {
  return sql`encode(${sql.ref(column)}, 'hex')`;
}

const SHA256_FIELDS = ['input_sha256', 'output_sha256'] as const;
const SHA256_HEX = /^[0-9a-f]{64}$/;

/**
 * Throws unless the event's SHA-256s are lowercase hex: they are stored as bytes and read back as lowercase hex, so any
 * other text would not hash as it did when appended. Checked before an event joins a batch, which it would fail whole.
 */
export function assertStorableHashes(event: AuditEventInput): void {
  for (const field of SHA256_FIELDS) {
    const value = event[field];
    if (value !== undefined && value !== null && !SHA256_HEX.test(value))
      throw new Error(`an audit event's ${field} is not a SHA-256 in lowercase hex`);
  }
}

/** Each event's content (without its place in the chain), hashed, and the contents as one JSON array. */
function contentsOf(events: TimedAuditEvent<unknown, unknown>[]): {
  contents: AuditContent[];
  hashes: string[];
  json: string;
} {
  const contents: AuditContent[] = [];
  const hashes: string[] = [];
  const rows: string[] = [];
  for (const { event, occurredAt, eventId } of events) {
    const content: AuditContent = {
      event_id: eventId ?? randomUUID(),
      occurred_at: occurredAt.toISOString(),
      actor: event.actor,
      event_type: event.event_type,
      ...optionalFields(event),
      details: event.details ?? {},
    };
    const sealed = sealContent(content);
    contents.push(content);
    hashes.push(sealed.contentHash);
    rows.push(sealed.json);
  }
  return { contents, hashes, json: `[${rows.join(',')}]` };
}

/** `linkHash` in SQL, over the same text: `seq:prev_hash:content_hash`. */
export function linkSql(
  seq: RawBuilder<unknown>,
  prevHash: RawBuilder<unknown>,
  contentHash: RawBuilder<unknown>,
): RawBuilder<string> {
  return sql<string>`encode(sha256(convert_to(${seq}::text || ':' || ${prevHash} || ':' || ${contentHash}, 'UTF8')), 'hex')`;
}

/**
 * Whether this process last found the chain closed: appends try that form first. Closing is one-way and
 * each statement checks the state it assumes, so a wrong guess (another database in a test) costs a retry.
 */
let chainClosedHint = false;

/**
 * Appends events in one statement: while the chain is open, linked after the head it locks (below);
 * once it is closed, as leaf records (`appendLeaves`). The changes the events carry commit with the rows.
 * docs/design/audit-chain.md#appending-linked-in-the-database
 */
export async function appendCarrying<T, R, G = never, A = never>(
  db: Kysely<DB>,
  events: TimedAuditEvent<T, G>[],
  rider?: AppendRider<T, R>,
  guard?: AppendGuard<G, A>,
): Promise<Appended<R | A>> {
  if (events.length === 0) return { records: [], appended: [], answers: [] };
  const prepared = prepareAppend(events, rider, guard);
  const first = chainClosedHint ? appendLeaves : appendLinked;
  const done = await first(db, prepared);
  if (done !== undefined) return done;
  chainClosedHint = !chainClosedHint;
  const retried = await (chainClosedHint ? appendLeaves : appendLinked)(db, prepared);
  if (retried === undefined) throw new Error('the audit chain head is missing');
  return retried;
}

/** An append's events as its statements take them: contents hashed, riders and guards sorted out. */
interface PreparedAppend<T, R, G, A> {
  events: TimedAuditEvent<T, G>[];
  contents: AuditContent[];
  hashes: string[];
  json: string;
  rider: AppendRider<T, R> | undefined;
  guard: AppendGuard<G, A> | undefined;
  items: T[];
  guarded: { items: G[]; ordinals: Array<number | null> };
}

function prepareAppend<T, R, G, A>(
  events: TimedAuditEvent<T, G>[],
  rider: AppendRider<T, R> | undefined,
  guard: AppendGuard<G, A> | undefined,
): PreparedAppend<T, R, G, A> {
  const { contents, hashes, json } = contentsOf(events);
  return {
    events,
    contents,
    hashes,
    json,
    rider,
    guard,
    items: ridersOf(events, rider),
    guarded: guardsOf(events, guard),
  };
}

/** What the statement of either form answers of the guarded events and the riders. */
function answersOf<T, R, G, A>(
  prepared: PreparedAppend<T, R, G, A>,
  changed: unknown,
  guardedChanged: unknown,
): Array<R | A | undefined> {
  const { events, rider, guard, items, guarded } = prepared;
  const guardAnswers = guarded.items.length > 0 && guard!.answers ? guard!.answers(guarded.items, guardedChanged) : [];
  const riderAnswers = spreadOver(events, items.length > 0 ? rider!.answers(items, changed) : []);
  return riderAnswers.map((answer, i) => {
    const ord = guarded.ordinals[i];
    return ord === null || ord === undefined ? answer : guardAnswers[ord - 1];
  });
}

/** Which guarded events a batch keeps: the unguarded ones, and those whose change was made. */
function keptSql(guarded: { ordinals: Array<number | null> }, made: string): RawBuilder<unknown> {
  return sql`(${guarded.ordinals}::int[])[r.n] is null
    or (${guarded.ordinals}::int[])[r.n] in (select ord from ${sql.table(made)})`;
}

/**
 * Appends events as leaf records once the chain is closed: plain INSERTs numbered by a sequence, each
 * listed in `audit_unsequenced` for the sequencer, with no lock that other appends share. Undefined,
 * writing nothing, while the chain is still open.
 */
async function appendLeaves<T, R, G, A>(
  db: Kysely<DB>,
  prepared: PreparedAppend<T, R, G, A>,
): Promise<Appended<R | A> | undefined> {
  const { contents, json, items, guarded, rider, guard } = prepared;
  const when = sql`exists (select 1 from closed)`;
  const riding = items.length > 0 ? rider!.steps(items, when) : undefined;
  const guarding = guarded.items.length > 0 ? guard!.steps(guarded.items, when) : undefined;
  // `closed` is a plain read: closing is one-way, so a snapshot that sees the chain closed is right to the end.
  const result = await sql<{ closed: boolean; seqs: string[] | null; changed: unknown; guarded: unknown }>`
    with closed as materialized (
      select 1 from audit_chain_head where id = 1 and closed
    )${guarding ? sql`, ${guarding.ctes}` : sql``}, batch as materialized (
      select r.n, r.content, nextval('audit_record_seq') as seq
      from jsonb_array_elements(${json}::jsonb) with ordinality r(content, n)
      where exists (select 1 from closed) ${guarding ? sql`and (${keptSql(guarded, guarding.made)})` : sql``}
      order by r.n
    ), appended as (
      insert into audit_events
      select e.* from batch b
      cross join lateral jsonb_populate_record(null::audit_events, b.content || jsonb_build_object(
        'seq', b.seq, 'prev_hash', null, 'hash', null, 'hash_scheme', ${HASH_SCHEME.leaf}::int,
        'input_sha256', decode(b.content->>'input_sha256', 'hex'),
        'output_sha256', decode(b.content->>'output_sha256', 'hex'))) e
      returning seq
    ), queued as (
      insert into audit_unsequenced select seq from appended
    )${riding ? sql`, ${riding.ctes}` : sql``}
    select exists (select 1 from closed) as closed,
      (select array_agg(n::text || ':' || seq::text order by n) from batch) as seqs,
      ${riding ? riding.changed : sql`null::json`} as changed,
      ${guarding?.changed ?? sql`null::json`} as guarded`.execute(db);
  const row = result.rows[0];
  if (row === undefined || !row.closed) return undefined;
  const seqOf = new Map((row.seqs ?? []).map((pair) => pair.split(':').map(Number) as [number, number]));
  if (!guarding && seqOf.size !== contents.length)
    throw new Error(`the audit append wrote ${seqOf.size} of ${contents.length} records`);
  const records: AuditRecord[] = [];
  const appended = contents.map((content, i) => {
    const seq = seqOf.get(i + 1);
    if (seq === undefined) return false;
    records.push({ ...content, seq, prev_hash: null, hash: null, hash_scheme: HASH_SCHEME.leaf });
    return true;
  });
  return { records, appended, answers: answersOf(prepared, row.changed, row.guarded) };
}

/**
 * Appends events linked in order after the chain head it locks, while the chain is open: the database
 * numbers them and hashes each link (`linkHash`) from the content hashes the gateway made, so no writer
 * needs to know the head beforehand. The changes the events carry go in the same statement, after the
 * head's lock (the lock order's first). Undefined, writing nothing, once the chain is closed.
 */
async function appendLinked<T, R, G, A>(
  db: Kysely<DB>,
  prepared: PreparedAppend<T, R, G, A>,
): Promise<Appended<R | A> | undefined> {
  const { events, contents, hashes, json, items, guarded, rider, guard } = prepared;
  const riding = items.length > 0 ? rider!.steps(items, sql`exists (select 1 from moved)`) : undefined;
  const ctes = riding ? sql`, ${riding.ctes}` : sql``;
  const changed = riding ? riding.changed : sql`null::json`;
  const guarding =
    guarded.items.length > 0 ? guard!.steps(guarded.items, sql`exists (select 1 from current)`) : undefined;
  const guardChanged = guarding?.changed ?? sql`null::json`;
  // `current` locks the head and reads it as it stands (a plain read would see it as it stood when
  // the statement began); everything after it follows from it, so it is the statement's first lock.
  // A closed chain's head is not locked: it is left out before the lock.
  const result = await sql<{
    seq: string;
    hash: string;
    hashes: string[] | null;
    kept: Array<number | string> | null;
    n: number;
    changed: unknown;
    guarded: unknown;
  }>`
    with recursive current as materialized (
      select seq, hash from audit_chain_head where id = 1 and not closed for no key update
    )${guarding ? sql`, ${guarding.ctes}` : sql``}, batch as materialized (
      select r.n, r.content, row_number() over (order by r.n) as k
      from jsonb_array_elements(${json}::jsonb) with ordinality r(content, n)
      ${guarding ? sql`where ${keptSql(guarded, guarding.made)}` : sql``}
    ), linked (k, seq, hash) as (
      select 0::bigint, seq, hash from current
      union all
      select b.k, l.seq + 1, ${linkSql(sql`(l.seq + 1)`, sql`l.hash`, sql`(${hashes}::text[])[b.n]`)}
      from linked l join batch b on b.k = l.k + 1
    ), moved as (
      update audit_chain_head h set seq = l.seq, hash = l.hash
      from (select seq, hash from linked order by k desc limit 1) l
      where h.id = 1 and exists (select 1 from batch)
      returning 1
    ), appended as (
      insert into audit_events
      select e.* from batch b
      join linked l on l.k = b.k
      join linked p on p.k = b.k - 1
      -- The hashes are stored as bytes: a bytea goes into the JSON as its text form, which the record
      -- reads back (a hex string there would be taken for the bytes of its digits).
      cross join lateral jsonb_populate_record(null::audit_events, b.content || jsonb_build_object(
        'seq', l.seq, 'prev_hash', decode(p.hash, 'hex'), 'hash', decode(l.hash, 'hex'),
        'hash_scheme', ${HASH_SCHEME.linked}::int,
        'input_sha256', decode(b.content->>'input_sha256', 'hex'),
        'output_sha256', decode(b.content->>'output_sha256', 'hex'))) e
      returning 1
    )${ctes}
    select c.seq, c.hash, (select array_agg(hash order by k) from linked where k > 0) as hashes,
      (select array_agg(n order by k) from batch) as kept, (select count(*)::int from appended) as n,
      ${changed} as changed, ${guardChanged} as guarded
    from current c`.execute(db);
  const row = result.rows[0];
  if (!row) return undefined;
  const kept = new Set((row.kept ?? []).map(Number));
  const linkedHashes = row.hashes ?? [];
  if (Number(row.n) !== kept.size || linkedHashes.length !== kept.size || (!guarding && kept.size !== events.length))
    throw new Error(`the audit append wrote ${row.n} of ${events.length} records`);
  let seq = Number(row.seq);
  let prevHash = row.hash;
  const records: AuditRecord[] = [];
  const appended = contents.map((content, i) => {
    if (!kept.has(i + 1)) return false;
    seq += 1;
    const hash = linkedHashes[records.length]!;
    records.push({ ...content, seq, prev_hash: prevHash, hash, hash_scheme: HASH_SCHEME.linked });
    prevHash = hash;
    return true;
  });
  return {
    records,
    after: { seq: Number(row.seq), hash: row.hash },
    appended,
    answers: answersOf(prepared, row.changed, row.guarded),
  };
}

/** The guarded events' changes, and for each event its 1-based place among them (null: not guarded). */
function guardsOf<G>(
  events: TimedAuditEvent<unknown, G>[],
  guard: AppendGuard<G, unknown> | undefined,
): { items: G[]; ordinals: Array<number | null> } {
  const items: G[] = [];
  const ordinals = events.map((e) => {
    if (e.onlyIf === undefined) return null;
    if (e.rides !== undefined) throw new Error('an audit event carries a change and a guard');
    items.push(e.onlyIf);
    return items.length;
  });
  if (items.length > 0 && !guard) throw new Error('an audit event is guarded but the log has no guard for it');
  return { items, ordinals };
}

/**
 * Appends events to the chain inside the caller's transaction: they become durable exactly when
 * the caller's change does (the head stays locked until then).
 */
export async function writeAuditEvents(trx: Transaction<DB>, events: TimedAuditEvent[]): Promise<AuditRecord[]> {
  return (await appendCarrying(trx, events)).records;
}

function ridersOf<T, R>(events: TimedAuditEvent<T, unknown>[], rider: AppendRider<T, R> | undefined): T[] {
  const items = events.flatMap((e) => (e.rides !== undefined ? [e.rides] : []));
  if (items.length > 0 && !rider) throw new Error('an audit event carries a change but the log has no rider for it');
  return items;
}

/** Each event's answer from the answers of those that carried a change, in order. */
function spreadOver<T, R>(events: TimedAuditEvent<T, unknown>[], answers: R[]): Array<R | undefined> {
  let next = 0;
  return events.map((e) => (e.rides !== undefined ? answers[next++] : undefined));
}

/**
 * Inserts records as they are, hashes and all, each as the JSON `sealRecord` or `sealLinked` writes
 * (hashes in hex), and leaves the chain head alone: how tests and benches put rows the gateway did
 * not append (a history, a forgery). The gateway itself appends only through `appendCarrying`.
 */
export async function insertSealedRecords(db: Kysely<DB>, records: string[]): Promise<void> {
  await sql`
    insert into audit_events
    select e.* from jsonb_array_elements(${`[${records.join(',')}]`}::jsonb) r(record)
    cross join lateral jsonb_populate_record(null::audit_events, r.record || jsonb_build_object(
      'prev_hash', decode(r.record->>'prev_hash', 'hex'), 'hash', decode(r.record->>'hash', 'hex'),
      'input_sha256', decode(r.record->>'input_sha256', 'hex'),
      'output_sha256', decode(r.record->>'output_sha256', 'hex'),
      -- A record hashed whole names no scheme (as in an export file).
      'hash_scheme', coalesce((r.record->>'hash_scheme')::int, ${HASH_SCHEME.record}))) e`.execute(db);
}

/**
 * Closes the linear chain at its head as it stands (once; later calls change nothing): from then on
 * records are written as leaf records (`appendLeaves`), numbered after the head, and the old walk
 * checks the chain up to it. Answers the head the chain ended at.
 */
export async function closeAuditChain(db: Kysely<DB>): Promise<ChainHead> {
  return db.transaction().execute(async (trx) => {
    // The head's lock waits out a linked append in flight; those that follow find the chain closed.
    const closing = await sql<{ seq: string; hash: string }>`
      update audit_chain_head set closed = true where id = 1 and not closed returning seq, hash`.execute(trx);
    const row = closing.rows[0];
    if (row === undefined) return readChainHead(trx);
    const seq = Number(row.seq);
    await sql`select setval('audit_record_seq', ${Math.max(seq, 1)}, ${seq > 0})`.execute(trx);
    return { seq, hash: row.hash };
  });
}

export async function readChainHead(db: Kysely<DB>): Promise<ChainHead> {
  const head = await db
    .selectFrom('audit_chain_head')
    .select(['seq', 'hash'])
    .where('id', '=', 1)
    .executeTakeFirstOrThrow();
  return { seq: Number(head.seq), hash: head.hash };
}

function optionalFields(event: AuditEventInput): Pick<AuditRecord, (typeof OPTIONAL_FIELDS)[number]> {
  const out = {} as Record<string, unknown>;
  for (const field of OPTIONAL_FIELDS) out[field] = event[field] ?? null;
  return out as Pick<AuditRecord, (typeof OPTIONAL_FIELDS)[number]>;
}

export interface AuditQuery {
  tenantId?: string | undefined;
  runId?: string | undefined;
  toolId?: string | undefined;
  agentId?: string | undefined;
  eventType?: string | undefined;
  since?: Date | undefined;
  until?: Date | undefined;
  /** Only events older than this seq (the cursor of the previous page). */
  beforeSeq?: number | undefined;
  limit: number;
}

/** Newest first, one page; `nextBeforeSeq` continues the listing when more remain. */
export async function listAuditEvents(
  db: Kysely<DB>,
  query: AuditQuery,
): Promise<{ items: AuditRecord[]; nextBeforeSeq: number | null }> {
  let q = db.selectFrom('audit_events').select(RECORD_COLUMNS);
  if (query.tenantId !== undefined) q = q.where('tenant_id', '=', query.tenantId);
  if (query.runId !== undefined) q = q.where('run_id', '=', query.runId);
  if (query.toolId !== undefined) q = q.where('tool_id', '=', query.toolId);
  if (query.agentId !== undefined) q = q.where('agent_id', '=', query.agentId);
  if (query.eventType !== undefined) q = q.where('event_type', '=', query.eventType);
  if (query.since !== undefined) q = q.where('occurred_at', '>=', query.since);
  if (query.until !== undefined) q = q.where('occurred_at', '<', query.until);
  if (query.beforeSeq !== undefined) q = q.where('seq', '<', query.beforeSeq);
  const rows = await q
    .orderBy('seq', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toRecord);
  const last = items[items.length - 1];
  return { items, nextBeforeSeq: rows.length > query.limit && last ? last.seq : null };
}

/** A record of one tool call of a run: its intent, outcome or denial. */
export type RunCallRecord = Pick<
  Selectable<AuditEventTable>,
  'event_id' | 'event_type' | 'status' | 'reason_code' | 'tool_call_id' | 'tool_version' | 'cost_units' | 'duration_ms'
> & {
  seq: number;
  message: string | null;
};

/**
 * The records of a run's tool calls made by one execution of it (`run_epoch` in their
 * details) since `since`, in chain order: what is known of a run whose executor was lost.
 * (`since` tells the run apart from an earlier one that had its id: see `RunRecovery`.)
 */
export async function listRunCallRecords(
  db: Kysely<DB> | Transaction<DB>,
  tenantId: string,
  runId: string,
  epoch: number,
  since: Date,
): Promise<RunCallRecord[]> {
  const rows = await db
    .selectFrom('audit_events')
    .select([
      'seq',
      'event_id',
      'event_type',
      'status',
      'reason_code',
      'tool_call_id',
      'tool_version',
      'cost_units',
      'duration_ms',
      sql<string | null>`details->>'message'`.as('message'),
    ])
    .where('run_id', '=', runId)
    .where('tenant_id', '=', tenantId)
    .where('tool_call_id', 'is not', null)
    .where(sql<string>`details->>'run_epoch'`, '=', String(epoch))
    .where('occurred_at', '>=', since)
    .orderBy('seq')
    .execute();
  return rows.map((row) => ({ ...row, seq: Number(row.seq) }));
}

/** A budget reservation, by its id and the run it was made for. */
export interface ReservationOfRun {
  id: string;
  tenantId: string;
  runId: string;
}

/** What a call's outcome record says it cost, and which record says so. */
export interface RecordedCost {
  costUnits: number;
  eventId: string;
}

/**
 * For open reservations, the cost their calls' outcome records name (absent without one): such a
 * call reached its backend even if its settlement was lost with its replica. Through `audit_events_run`.
 */
export async function findRecordedCosts(
  db: Kysely<DB> | Transaction<DB>,
  reservations: ReservationOfRun[],
): Promise<Map<string, RecordedCost>> {
  if (reservations.length === 0) return new Map();
  const rows = await db
    .selectFrom('audit_events')
    .select(['event_id', 'cost_units', sql<string>`details->>'reservation_id'`.as('reservation_id')])
    .where('run_id', '=', (eb) => eb.fn.any(eb.val([...new Set(reservations.map((r) => r.runId))])))
    .where('tenant_id', '=', (eb) => eb.fn.any(eb.val([...new Set(reservations.map((r) => r.tenantId))])))
    .where('tool_call_id', 'is not', null)
    .where('status', 'in', ['completed', 'failed'])
    .where(sql<string>`details->>'reservation_id'`, '=', (eb) => eb.fn.any(eb.val(reservations.map((r) => r.id))))
    .execute();
  return new Map(
    rows
      .filter((row) => row.cost_units !== null)
      .map((row) => [row.reservation_id, { costUnits: Number(row.cost_units), eventId: row.event_id }]),
  );
}

export interface ChainVerification {
  ok: boolean;
  checked: number;
  first_bad_seq: number | null;
  /** The last row of the chain, when it verified and has rows: what an operator anchors elsewhere. */
  head: ChainHead | null;
  /** Present when an anchor was given: whether the chain still holds it. */
  anchor?: AnchorCheck;
  /** Present when the walk crossed ranges detached after export: verified up to their ends, not row by row. */
  archived?: { from_seq: number; to_seq: number; partition: string }[];
}

/** The ranges operators detached after export, keyed by their first seq. */
export async function readArchivedRanges(db: Kysely<DB> | Transaction<DB>): Promise<Map<number, ArchivedRange>> {
  const rows = await db
    .selectFrom('audit_partition_archives')
    .select(['partition', 'from_seq', 'to_seq', 'prev_hash', 'last_hash', 'event_seq'])
    .execute();
  return new Map(
    rows.map((row) => [
      Number(row.from_seq),
      { ...row, from_seq: Number(row.from_seq), to_seq: Number(row.to_seq), event_seq: Number(row.event_seq) },
    ]),
  );
}

/**
 * Why a chain does not hold an anchor: `missing`, no row at its seq (rows were cut off);
 * `hash_mismatch`, the row there has another hash (it, or a row before it, was rewritten);
 * `chain_broken`, the row is as anchored but the chain breaks before reaching it.
 */
export type AnchorFailure = 'missing' | 'hash_mismatch' | 'chain_broken';

export interface AnchorCheck {
  seq: number;
  ok: boolean;
  reason: AnchorFailure | null;
}

/**
 * Walks the chain from one snapshot of the rows and the head, recomputing every hash; `first_bad_seq`
 * is where the log first departs from an intact chain, and `anchor` (a head kept outside the database)
 * must still be held: docs/design/audit-chain.md#the-chain-and-its-verification and #anchors.
 */
export async function verifyAuditChain(
  db: Kysely<DB>,
  pageSize = 10000,
  anchor?: ChainHead,
  /** A row already trusted (a signed checkpoint): the walk starts after it, and `checked` counts from there. */
  from?: ChainHead,
): Promise<ChainVerification> {
  // One snapshot: an append committing during the walk would otherwise pass for rows cut off.
  return db
    .transaction()
    .setIsolationLevel('repeatable read')
    .setAccessMode('read only')
    .execute(async (trx) => {
      const head = await readChainHead(trx);
      const archives = await readArchivedRanges(trx);
      const archivedEnd = from === undefined ? undefined : [...archives.values()].find((r) => r.to_seq === from.seq);
      if (from !== undefined && from.seq > 0 && archivedEnd?.last_hash !== from.hash) {
        const start = await trx
          .selectFrom('audit_events')
          .select(hexOf('hash').as('hash'))
          .where('seq', '=', from.seq)
          .executeTakeFirst();
        // The trusted row itself must still be there as trusted; which earlier row changed is a full walk's to say.
        if (start?.hash !== from.hash) return { ok: false, checked: 0, first_bad_seq: from.seq, head: null };
      }
      const walked = await walkChain(trx, head, pageSize, from ?? { seq: 0, hash: GENESIS_HASH }, { archives });
      const unreported = walked.ok ? await firstUnreportedArchive(trx, walked.archived) : undefined;
      const { archived, through, ...rest } =
        unreported === undefined
          ? walked
          : { ...walked, ok: false, first_bad_seq: unreported, through: unreported - 1 };
      const verified: ChainVerification = {
        ...rest,
        head: rest.ok && head.seq > 0 ? head : null,
        ...(archived.length > 0
          ? { archived: archived.map(({ from_seq, to_seq, partition }) => ({ from_seq, to_seq, partition })) }
          : {}),
      };
      if (anchor === undefined) return verified;
      const start = from?.seq ?? 0;
      const check = await checkAnchor(trx, anchor, through, archived);
      if (check.ok) return { ...verified, anchor: check };
      // Where the anchor proves the log differs: the first seq missing up to it, or the anchored row
      // itself (the anchor tells that some row up to it was rewritten, not which). An earlier break
      // of the chain comes first, as it does without an anchor.
      const provenBad = check.reason === 'missing' ? through + 1 : anchor.seq;
      const firstBad = rest.first_bad_seq === null ? provenBad : Math.min(rest.first_bad_seq, provenBad);
      const archivedRows = archived.reduce((n, r) => n + (r.to_seq < provenBad ? r.to_seq - r.from_seq + 1 : 0), 0);
      // A head the anchor refutes is no head to anchor next.
      return {
        ...verified,
        ok: false,
        checked: Math.max(Math.min(rest.checked, provenBad - 1 - start - archivedRows), 0),
        first_bad_seq: firstBad,
        head: null,
        anchor: check,
      };
    });
}

/**
 * Walks the chain from `from` (trusted) to `to` only, crossing archived ranges: what vouches for a seal,
 * or, with `onRows`, what an export streams. In chunks of `chunkRows`, a snapshot each: one held for a
 * month's export would keep vacuum from every table for hours.
 */
export async function walkRange(
  db: Kysely<DB>,
  from: ChainHead,
  to: ChainHead,
  onRows?: (lines: string[]) => Promise<void>,
  pageSize = 10000,
  chunkRows = 1_000_000,
): Promise<WalkResult> {
  let start = from;
  let checked = 0;
  const archived: ArchivedRange[] = [];
  const ranges = [...(await readArchivedRanges(db)).values()];
  const inArchived = (seq: number) => ranges.some((range) => range.from_seq <= seq && seq <= range.to_seq);
  for (;;) {
    // A chunk ends at a record of the live chain; where there is none (an archived range), the rest goes in one.
    const stored =
      start.seq + chunkRows < to.seq && !inArchived(start.seq + chunkRows)
        ? await db
            .selectFrom('audit_events')
            .select(hexOf('hash').as('hash'))
            .where('seq', '=', String(start.seq + chunkRows))
            .executeTakeFirst()
        : undefined;
    const end: ChainHead =
      stored?.hash === undefined || stored.hash === null ? to : { seq: start.seq + chunkRows, hash: stored.hash };
    const walked = await db
      .transaction()
      .setIsolationLevel('repeatable read')
      .setAccessMode('read only')
      .execute(async (trx) => {
        const archives = await readArchivedRanges(trx);
        return walkChain(trx, end, pageSize, start, { archives, bounded: true, ...(onRows ? { onRows } : {}) });
      });
    checked += walked.checked;
    archived.push(...walked.archived);
    if (!walked.ok || end.seq === to.seq) return { ...walked, checked, archived };
    start = end;
  }
}

/**
 * The first archived range crossed that the chain does not report (its `audit.partition_detached`
 * record, or the copy a later range's record carries): such a range is rows removed.
 */
async function firstUnreportedArchive(trx: Transaction<DB>, crossed: ArchivedRange[]): Promise<number | undefined> {
  if (crossed.length === 0) return undefined;
  const rows = await trx
    .selectFrom('audit_events')
    .select(['seq', 'details'])
    .where('event_type', '=', 'audit.partition_detached')
    .where(
      'seq',
      'in',
      crossed.map((range) => range.event_seq),
    )
    .execute();
  const stored = new Map(rows.map((row) => [Number(row.seq), row.details as unknown as DetachReport]));
  // A container's record comes after the one it holds (required, so that this ends).
  const reportOf = (range: ArchivedRange): DetachReport | undefined => {
    const own = stored.get(range.event_seq);
    if (own !== undefined) return own;
    const container = crossed.find(
      (c) => c.from_seq <= range.event_seq && range.event_seq <= c.to_seq && c.event_seq > range.event_seq,
    );
    if (container === undefined) return undefined;
    return reportOf(container)?.archived_records?.find((r) => r.event_seq === range.event_seq);
  };
  const bad = crossed.filter((range) => {
    const report = reportOf(range);
    return (
      report === undefined ||
      report.partition !== range.partition ||
      report.from_seq !== range.from_seq ||
      report.to_seq !== range.to_seq ||
      report.prev_hash !== range.prev_hash ||
      report.last_hash !== range.last_hash
    );
  });
  return bad.length === 0 ? undefined : Math.min(...bad.map((range) => range.from_seq));
}

/** What an `audit.partition_detached` record says (its `details`). */
export interface DetachReport {
  partition: string;
  from_seq: number;
  to_seq: number;
  prev_hash: string;
  last_hash: string;
  /** The reports of earlier detachments whose records this range holds, each with its seq. */
  archived_records?: (Omit<DetachReport, 'archived_records'> & { event_seq: number })[];
}

/** The `audit.partition_detached` records among the rows from `fromSeq` to `toSeq`, with their seq. */
export async function detachReportsBetween(
  db: Kysely<DB>,
  fromSeq: number,
  toSeq: number,
): Promise<(Omit<DetachReport, 'archived_records'> & { event_seq: number })[]> {
  const rows = await db
    .selectFrom('audit_events')
    .select(['seq', 'details'])
    .where('event_type', '=', 'audit.partition_detached')
    .where('seq', '>=', String(fromSeq))
    .where('seq', '<=', String(toSeq))
    .orderBy('seq')
    .execute();
  return rows.map((row) => {
    const { partition, from_seq, to_seq, prev_hash, last_hash } = row.details as unknown as DetachReport;
    return { event_seq: Number(row.seq), partition, from_seq, to_seq, prev_hash, last_hash };
  });
}

/**
 * Whether the chain holds `anchor`: its row is there with its hash, at or below `through`, the
 * last seq the walk verified (a verified row's stored hash is the one recomputed).
 */
async function checkAnchor(
  trx: Transaction<DB>,
  anchor: ChainHead,
  through: number,
  archived: ArchivedRange[],
): Promise<AnchorCheck> {
  // An archived range's last link is known without its row.
  const stored =
    archived.find((range) => range.to_seq === anchor.seq)?.last_hash ??
    (
      await trx
        .selectFrom('audit_events')
        .select(hexOf('hash').as('hash'))
        .where('seq', '=', anchor.seq)
        .executeTakeFirst()
    )?.hash;
  const reason: AnchorFailure | null =
    stored === undefined
      ? 'missing'
      : stored !== anchor.hash
        ? 'hash_mismatch'
        : anchor.seq > through
          ? 'chain_broken'
          : null;
  return { seq: anchor.seq, ok: reason === null, reason };
}

/** Every column of a record, in the table's order, its hashes as hex. */
const RECORD_COLUMNS = [
  'seq',
  'event_id',
  'occurred_at',
  'tenant_id',
  'actor',
  'agent_id',
  'event_type',
  'run_id',
  'tool_call_id',
  'tool_id',
  'tool_version',
  'tool_category',
  'risk_level',
  'trace_id',
  'organization_id',
  'assessment_id',
  'status',
  'reason_code',
  hexOf('input_sha256').as('input_sha256'),
  hexOf('output_sha256').as('output_sha256'),
  'duration_ms',
  'cost_units',
  'details',
  hexOf('prev_hash').as('prev_hash'),
  hexOf('hash').as('hash'),
  'hash_scheme',
] as const;

type StoredRecord = Omit<Selectable<AuditEventTable>, HashColumn> & Pick<AuditRecord, HashColumn>;

function toRecord(row: StoredRecord): AuditRecord {
  return {
    ...row,
    seq: Number(row.seq),
    occurred_at: rfc3339(row.occurred_at),
    duration_ms: row.duration_ms === null ? null : Number(row.duration_ms),
    cost_units: row.cost_units === null ? null : Number(row.cost_units),
    details: typeof row.details === 'string' ? (JSON.parse(row.details) as Record<string, unknown>) : row.details,
  };
}

/**
 * A stored time as RFC 3339, or null for one it cannot write (infinity, or a year outside
 * 0000–9999): only an edit of the row puts such a time there, and the listing still shows the row.
 */
function rfc3339(stored: Date | number): string | null {
  const time = new Date(stored);
  const year = time.getUTCFullYear();
  return year >= 0 && year <= 9999 ? time.toISOString() : null;
}
