import { sql, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { canonicalJson, HASH_SCHEME } from './audit-hash.js';
import { readingRows, toWalked, type PageRow, type WalkedRow } from './hashed-rows.js';

/** The last link of the chain: what the next event's `prev_hash` and `seq` follow. */
export interface ChainLink {
  seq: number;
  hash: string;
}

export interface WalkResult {
  ok: boolean;
  checked: number;
  first_bad_seq: number | null;
  /** The archived ranges the walk crossed instead of rows (detached partitions). */
  archived: ArchivedRange[];
  /** The last seq the walk vouches for, rows and archived ranges alike. */
  through: number;
}

/** A range of the chain detached after export: it chains from `prev_hash` and ends at `last_hash`. */
export interface ArchivedRange {
  partition: string;
  from_seq: number;
  to_seq: number;
  prev_hash: string;
  last_hash: string;
  /** The seq of the record that reports the detachment. */
  event_seq: number;
}

export interface WalkOptions {
  /** Detached ranges, keyed by `from_seq`: the walk crosses each where it starts, if it chains on. */
  archives?: Map<number, ArchivedRange>;
  /** Stop at `head` without reporting the rows after it (a range of the chain, not all of it). */
  bounded?: boolean;
  /** Each verified page as lines of an export: the canonical JSON that was hashed, and its hash. */
  onRows?: (lines: string[]) => Promise<void>;
}

/** A verified row as a line of an export: the whole record in canonical JSON, `hash` last. */
function exportLine(row: WalkedRow): string {
  const record = row.linked
    ? (canonicalJson({
        ...(JSON.parse(row.canonical) as Record<string, unknown>),
        hash_scheme: HASH_SCHEME.linked,
        prev_hash: row.prevHash,
        seq: row.seq,
      }) ?? '{}')
    : row.canonical;
  return `${record.slice(0, -1)},"hash":"${row.hash}"}`;
}

/**
 * Walks the chain in key order from `from` (the genesis, or a trusted checkpoint) against `head`,
 * both from the caller's snapshot, and recomputes every hash. Rows arrive as text, converted and
 * serialised here in one pass; the next page is asked for before this one is hashed.
 */
export async function walkChain(
  trx: Transaction<DB>,
  head: ChainLink,
  pageSize: number,
  from: ChainLink,
  options: WalkOptions = {},
): Promise<WalkResult> {
  const archives = options.archives ?? new Map<number, ArchivedRange>();
  const crossed: ArchivedRange[] = [];
  const { shape, selected, schemed } = await readingRows(trx);
  type Page = Promise<{ rows: PageRow[] }>;
  const page = (after: number | undefined): Page =>
    sql<PageRow>`
      select ${selected} from audit_events
      where true
      ${after === undefined ? sql`` : sql`and audit_events.seq > ${after}`}
      ${options.bounded ? sql`and audit_events.seq <= ${head.seq}` : sql``}
      -- Leaf records after a closed chain's head are the tree's to verify, not the chain's.
      ${schemed ? sql`and (audit_events.seq <= ${head.seq} or audit_events.hash_scheme <> ${HASH_SCHEME.leaf})` : sql``}
      order by audit_events.seq limit ${pageSize}`.execute(trx);
  // An archived range that starts where the walk stands and chains on is crossed: its file holds its records.
  const crossArchives = (): void => {
    for (let range = archives.get(expectedSeq); range !== undefined; range = archives.get(expectedSeq)) {
      if (range.prev_hash !== prevHash || range.to_seq > head.seq) return;
      crossed.push(range);
      expectedSeq = range.to_seq + 1;
      prevHash = range.last_hash;
    }
  };
  // A record of a neighbouring month inside a crossed range (clocks disagreed at the boundary) stays
  // attached with its month; the range's file holds it too.
  const inCrossed = (seq: number): boolean => crossed.some((range) => range.from_seq <= seq && seq <= range.to_seq);

  let expectedSeq = from.seq + 1;
  let prevHash = from.hash;
  let checked = 0;
  let pastHeadSeq: number | undefined;
  // No lower bound from the genesis: a row below seq 1 is walked too, and reported as itself.
  let next: Page | undefined = page(from.seq > 0 ? from.seq : undefined);
  crossArchives();
  while (next !== undefined) {
    const rows: PageRow[] = (await next).rows;
    const last = rows[rows.length - 1];
    const lastSeq = last === undefined ? undefined : Number(last.seq);
    next = rows.length === pageSize && lastSeq !== undefined && lastSeq <= head.seq ? page(lastSeq) : undefined;
    const inexact: { seq: number; details: unknown }[] = [];
    const pageSeqs: number[] = [];
    const lines: string[] = [];
    let brokenAt: number | undefined;
    for (const raw of rows) {
      const seq = Number(raw.seq);
      if (seq > head.seq) {
        pastHeadSeq = seq;
        break;
      }
      if (seq < expectedSeq && inCrossed(seq)) continue;
      const row = toWalked(raw, shape);
      if (!row.readExactly || seq !== expectedSeq || row.prevHash !== prevHash || row.computed !== row.hash) {
        brokenAt = Math.min(seq, expectedSeq);
        break;
      }
      if (row.inexactDetails !== undefined) inexact.push({ seq, details: row.inexactDetails });
      if (options.onRows) lines.push(exportLine(row));
      pageSeqs.push(seq);
      checked += 1;
      expectedSeq += 1;
      prevHash = row.hash;
      crossArchives();
    }
    if (brokenAt !== undefined || pastHeadSeq !== undefined) {
      // Let a page asked for ahead finish before the transaction is used again.
      await next?.catch(() => undefined);
      next = undefined;
    }
    // Rows checked so far run from `from` without gaps: the rows before an edited one number seq - 1.
    const edited = await firstDetailsUnlikeHashed(trx, inexact);
    if (edited !== undefined) {
      await next?.catch(() => undefined);
      const before = checked - pageSeqs.filter((seq) => seq >= edited).length;
      return { ok: false, checked: before, first_bad_seq: edited, archived: crossed, through: edited - 1 };
    }
    if (brokenAt !== undefined)
      return { ok: false, checked, first_bad_seq: brokenAt, archived: crossed, through: brokenAt - 1 };
    if (options.onRows && lines.length > 0) await options.onRows(lines);
  }
  if (expectedSeq - 1 < head.seq)
    return { ok: false, checked, first_bad_seq: expectedSeq, archived: crossed, through: expectedSeq - 1 };
  if (prevHash !== head.hash) {
    // The last row is not the one the head names (an empty chain's head names seq 1's place).
    const lastSeq = Math.max(head.seq, 1);
    return {
      ok: false,
      checked: Math.max(checked - 1, 0),
      first_bad_seq: lastSeq,
      archived: crossed,
      through: lastSeq - 1,
    };
  }
  if (pastHeadSeq !== undefined)
    return { ok: false, checked, first_bad_seq: pastHeadSeq, archived: crossed, through: head.seq };
  return { ok: true, checked, first_bad_seq: null, archived: crossed, through: head.seq };
}

/**
 * The first of these rows whose stored `details` differ from those hashed, in one statement: jsonb
 * compares numbers as exact decimals, so an edit below a double's precision shows here.
 */
async function firstDetailsUnlikeHashed(
  trx: Transaction<DB>,
  rows: { seq: number; details: unknown }[],
): Promise<number | undefined> {
  if (rows.length === 0) return undefined;
  const hashed = `[${rows.map((row) => `{"seq":${row.seq},"details":${canonicalJson(row.details) ?? 'null'}}`).join(',')}]`;
  const result = await sql<{ seq: number | null }>`
    select min(stored.seq) as seq
    from jsonb_to_recordset(${hashed}::jsonb) as hashed(seq bigint, details jsonb)
    join audit_events stored on stored.seq = hashed.seq
    where stored.details is distinct from hashed.details`.execute(trx);
  const seq = result.rows[0]?.seq;
  return seq === null || seq === undefined ? undefined : Number(seq);
}
