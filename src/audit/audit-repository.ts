import { randomUUID } from 'node:crypto';
import { sql, type Kysely, type RawBuilder, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { OPTIONAL_FIELDS, type AuditEventInput, type AuditRecord } from './audit-event.js';
import { HASH_SCHEME, sealContent, type AuditContent } from './audit-hash.js';

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
let chainClosedHint = true;

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
