import { hash as digest } from 'node:crypto';
import { sql, type RawBuilder, type Transaction } from 'kysely';
import type { DB } from '../db/schema.js';
import { canonicalJson, HASH_SCHEME, linkHash } from './audit-hash.js';

/*
 * Rows of \`audit_events\` read as the gateway hashed them: every column as text in one JSON array, converted and
 * serialised back to the canonical JSON that was hashed. The chain's walk and the Merkle tree's leaves read them so.
 */

/** How a column arrives as text and becomes the value JavaScript hashed (`hex`: bytes, as their hex string). */
type Kind = 'int' | 'float' | 'time' | 'json' | 'bool' | 'text' | 'hex';

interface Column {
  name: string;
  kind: Kind;
  /** `"name":`, as canonical JSON writes the key. */
  key: string;
}

const KINDS: Record<string, Kind> = {
  bigint: 'int',
  integer: 'int',
  smallint: 'int',
  'double precision': 'float',
  real: 'float',
  'timestamp with time zone': 'time',
  jsonb: 'json',
  json: 'json',
  boolean: 'bool',
  bytea: 'hex',
};

/** Columns a `linked` record's content leaves out: they are in its link instead. */
const LINK_COLUMNS = new Set(['seq', 'prev_hash']);

/**
 * Every column of `audit_events` but `hash` and `hash_scheme`, in the order canonical JSON sorts
 * keys, whether the table has `hash_scheme` yet (a log before migration 0019 has none: scheme 1),
 * and the kind of `hash` (hex text before migration 0022, bytes since).
 */
async function hashedColumns(trx: Transaction<DB>): Promise<{ columns: Column[]; schemed: boolean; hashKind: Kind }> {
  const { rows } = await sql<{ column_name: string; data_type: string }>`
    select column_name, data_type from information_schema.columns
    where table_schema = current_schema() and table_name = 'audit_events'`.execute(trx);
  const columns = rows
    .filter((row) => row.column_name !== 'hash' && row.column_name !== 'hash_scheme')
    .map((row) => ({
      name: row.column_name,
      kind: KINDS[row.data_type] ?? 'text',
      key: `${JSON.stringify(row.column_name)}:`,
    }))
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  const hashType = rows.find((row) => row.column_name === 'hash')?.data_type ?? 'text';
  return {
    columns,
    schemed: rows.some((row) => row.column_name === 'hash_scheme'),
    hashKind: KINDS[hashType] ?? 'text',
  };
}

const ISO_UTC = /^(\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d)(?:\.(\d{1,6}))?\+00$/;

/**
 * A stored time (as PostgreSQL writes it in UTC, ISO style) as RFC 3339 to the millisecond, as the
 * appender wrote it from a Date; null for one it could not have written: a part of a millisecond
 * (PostgreSQL writes no trailing zeros), infinity, BC, a year past 9999.
 */
function rfc3339(text: string): string | null {
  const match = ISO_UTC.exec(text);
  if (match === null || (match[3] !== undefined && match[3].length > 3)) return null;
  return `${match[1]}T${match[2]}.${(match[3] ?? '').padEnd(3, '0')}Z`;
}

/** JSON strings; and, outside them, a number a double may not hold exactly: a fraction, an exponent, 16 digits. */
const JSON_STRING = /"(?:[^"\\]|\\.)*"/g;
const INEXACT_NUMBER = /\d[.eE]|\d{16}/;

/** Whether every number in this JSON text is an integer a double holds exactly (most details). */
function numbersExact(json: string): boolean {
  return !INEXACT_NUMBER.test(json.replace(JSON_STRING, '""'));
}

/**
 * A row's texts from the JSON array of strings PostgreSQL wrote (`array_to_json` escapes as
 * JSON.stringify does, many columns for the price of one `to_json`), each as its JSON: a string
 * column's JSON is a slice of the array. Without a backslash in it nothing was escaped, so every
 * quote delimits a text and the array splits without parsing; with one, it is parsed.
 */
function jsonTexts(array: string, count: number): { json: (string | null)[]; escaped: boolean } {
  if (array.includes('\\')) {
    const texts = JSON.parse(array) as (string | null)[];
    if (texts.length !== count) throw new Error(`audit_events: a row arrived with ${texts.length} texts, not ${count}`);
    return { json: texts.map((text) => (text === null ? null : JSON.stringify(text))), escaped: true };
  }
  const json = new Array<string | null>(count);
  let at = 1;
  for (let i = 0; i < count; i += 1) {
    if (array.charCodeAt(at) === 110) {
      json[i] = null;
      at += 5;
    } else {
      const end = array.indexOf('"', at + 1);
      json[i] = array.slice(at, end + 1);
      at = end + 2;
    }
  }
  if (at !== array.length) throw new Error(`audit_events: a row arrived with other than ${count} texts`);
  return { json, escaped: false };
}

/** A text from its JSON in the array: unescaped only if the array was escaped at all. */
function textOf(json: string | null | undefined, escaped: boolean): string | null {
  if (json === null || json === undefined) return null;
  return escaped ? (JSON.parse(json) as string) : json.slice(1, -1);
}

/** A page's row: its non-JSON columns as one JSON array of texts (`$texts`), its JSON columns apart. */
export type PageRow = Record<string, string | null>;

/** A row as the walk checks it. */
export interface WalkedRow {
  seq: number;
  eventId: string;
  /** As RFC 3339, or null for a time no appender wrote. */
  occurredAt: string | null;
  hash: string;
  prevHash: string;
  /** The hash the row's fields make under its scheme (undefined for a scheme none knows: an edit). */
  computed: string | undefined;
  /** The canonical JSON that was hashed: the whole record, or a `linked` record's content. */
  canonical: string;
  linked: boolean;
  /** Whether JavaScript reads the row exactly (no part of a millisecond, no NaN, a writable time). */
  readExactly: boolean;
  /** Its `details` when they hold a number JavaScript may read inexactly: the database compares them. */
  inexactDetails: unknown;
}

/** A hashed column as a row of a page holds it. */
interface RowColumn extends Column {
  /** Its index in `$texts`, or -1 for a JSON column, read apart. */
  at: number;
  /** Whether a `linked` record's content leaves it out. */
  link: boolean;
  /** `,"name":`, for every column but the first written. */
  nextKey: string;
}

/** How the walk reads `audit_events` as it stands: its hashed columns, and where a row's texts are. */
export interface RowShape {
  columns: RowColumn[];
  /** How many texts `$texts` holds: the columns not read apart, then the row's hash and scheme. */
  count: number;
  seq: number;
  prevHash: number;
  eventId: number;
  occurredAt: number;
  hash: number;
  scheme: number;
}

function rowShape(columns: Column[]): RowShape {
  let count = 0;
  const rowColumns = columns.map((column) => ({
    ...column,
    at: column.kind === 'json' ? -1 : count++,
    link: LINK_COLUMNS.has(column.name),
    nextKey: `,${column.key}`,
  }));
  const at = (name: string): number => rowColumns.find((column) => column.name === name)?.at ?? -1;
  return {
    columns: rowColumns,
    count: count + 2,
    seq: at('seq'),
    prevHash: at('prev_hash'),
    eventId: at('event_id'),
    occurredAt: at('occurred_at'),
    hash: count,
    scheme: count + 1,
  };
}

/** A column as the text JavaScript had: bytes as their lowercase hex, anything else as PostgreSQL writes it. */
function textOfColumn(name: string, kind: Kind): RawBuilder<unknown> {
  const ref = sql.ref(`audit_events.${name}`);
  return kind === 'hex' ? sql`encode(${ref}, 'hex')` : sql`${ref}::text`;
}

/** A row's `$texts` array: every hashed column but the JSON ones as text, then its hash and scheme. */
function textsSql(shape: RowShape, hashKind: Kind, scheme: RawBuilder<unknown>): RawBuilder<unknown> {
  const texts = shape.columns
    .filter((column) => column.at >= 0)
    .map((column) => textOfColumn(column.name, column.kind));
  return sql`array_to_json(array[${sql.join([...texts, textOfColumn('hash', hashKind), sql`(${scheme})::text`])}])::text`;
}

export function toWalked(row: PageRow, shape: RowShape): WalkedRow {
  const { json: texts, escaped } = jsonTexts(row['$texts'] as string, shape.count);
  const scheme = textOf(texts[shape.scheme], escaped);
  const linked = scheme === LINKED;
  // A leaf record's bytes are its content, as a linked record's are: it has no chain fields to leave out.
  const content = linked || scheme === LEAF;
  let canonical = '{';
  let readExactly = true;
  let inexactDetails: unknown;
  for (const column of shape.columns) {
    if (content && column.link) continue;
    const { kind } = column;
    let json: string;
    if (kind === 'json') {
      const value = row[column.name];
      if (value === null || value === undefined) json = 'null';
      else {
        const parsed: unknown = JSON.parse(value);
        json = canonicalJson(parsed) ?? 'null';
        if (!numbersExact(value)) inexactDetails = parsed;
      }
    } else if (kind === 'text' || kind === 'hex' || kind === 'bool') {
      // A boolean's text is its JSON; a string's is in the array.
      json = (kind === 'bool' ? textOf(texts[column.at], escaped) : texts[column.at]) ?? 'null';
    } else {
      const value = textOf(texts[column.at], escaped);
      if (value === null) json = 'null';
      else if (kind === 'int') json = String(Number(value));
      else if (kind === 'float') {
        const number = Number(value);
        // NaN and infinities hash as null, as a null does: JavaScript could not tell them apart.
        if (!Number.isFinite(number)) readExactly = false;
        json = Number.isFinite(number) ? String(number) : 'null';
      } else {
        const time = rfc3339(value);
        if (time === null) readExactly = false;
        json = time === null ? 'null' : `"${time}"`;
      }
    }
    canonical += canonical.length === 1 ? column.key + json : column.nextKey + json;
  }
  canonical += '}';
  const seq = Number(textOf(texts[shape.seq], escaped));
  const prevHash = textOf(texts[shape.prevHash], escaped) as string;
  const computed = linked
    ? linkHash(seq, prevHash, digest('sha256', canonical, 'hex'))
    : scheme === RECORD
      ? digest('sha256', canonical, 'hex')
      : undefined;
  const occurredAt = textOf(texts[shape.occurredAt], escaped);
  return {
    seq,
    eventId: textOf(texts[shape.eventId], escaped) as string,
    occurredAt: occurredAt === null ? null : rfc3339(occurredAt),
    hash: textOf(texts[shape.hash], escaped) as string,
    prevHash,
    computed,
    canonical,
    linked,
    readExactly,
    inexactDetails,
  };
}

/** How rows are selected and read as the gateway hashed them, in this transaction. */
export async function readingRows(
  trx: Transaction<DB>,
): Promise<{ shape: RowShape; selected: RawBuilder<unknown>; schemed: boolean }> {
  // The texts the conversion expects, whatever the session's settings were.
  await sql`select set_config('timezone', 'UTC', true), set_config('datestyle', 'ISO, YMD', true),
    set_config('extra_float_digits', '1', true)`.execute(trx);
  const { columns, schemed, hashKind } = await hashedColumns(trx);
  const shape = rowShape(columns);
  const selected = sql.join([
    // Ordered and filtered by `audit_events.seq`: a bare `seq` would name the text column here.
    sql`audit_events.seq::text as seq`,
    sql`${textsSql(shape, hashKind, schemed ? sql`audit_events.hash_scheme` : sql.lit(HASH_SCHEME.record))} as "$texts"`,
    ...columns
      .filter((column) => column.kind === 'json')
      .map((column) => sql`${sql.ref(`audit_events.${column.name}`)}::text as ${sql.ref(column.name)}`),
  ]);
  return { shape, selected, schemed };
}

/**
 * A record as a leaf of the Merkle tree: its leaf bytes are the canonical JSON the chain hashed (a `linked`
 * record's content; an older record whole, but for its hash), which is the record `GET /audit/events` shows.
 */
export interface LeafRecord {
  seq: number;
  eventId: string;
  occurredAt: string | null;
  canonical: string;
  /** A record of the chain: its link (`linked`), or its whole-record hash (`record`, whose bytes hold its seq). */
  chain?: { scheme: 'linked' | 'record'; prevHash: string; hash: string };
}

/** Which records `readLeafRecords` reads: those after a seq (up to another, at most `limit`), or those of these seqs. */
export type LeafRecordQuery = { afterSeq: number; throughSeq?: number; limit: number } | { seqs: number[] };

/**
 * Records as leaves, in seq order: those after `afterSeq` (at most `limit`), or those of the given seqs.
 * Runs in the caller's transaction, whose settings it sets for reading rows as they were hashed.
 */
export async function readLeafRecords(trx: Transaction<DB>, which: LeafRecordQuery): Promise<LeafRecord[]> {
  return (await leafRecordReader(trx))(which);
}

/** `readLeafRecords` for many reads in one transaction: its settings and the table's columns looked up once. */
export async function leafRecordReader(
  trx: Transaction<DB>,
): Promise<(which: LeafRecordQuery) => Promise<LeafRecord[]>> {
  const { shape, selected } = await readingRows(trx);
  return async (which) => {
    // Seqs close together (leaves sequenced in seq order) are read as a range: one index scan, not one per seq.
    const dense =
      'seqs' in which &&
      which.seqs.length > 0 &&
      Math.max(...which.seqs) - Math.min(...which.seqs) < 2 * which.seqs.length;
    const where = !('seqs' in which)
      ? which.throughSeq === undefined
        ? sql`audit_events.seq > ${which.afterSeq}`
        : sql`audit_events.seq > ${which.afterSeq} and audit_events.seq <= ${which.throughSeq}`
      : dense
        ? sql`audit_events.seq between ${Math.min(...which.seqs)} and ${Math.max(...which.seqs)}`
        : sql`audit_events.seq = any(${which.seqs.map(String)}::bigint[])`;
    const limit = 'seqs' in which ? sql`` : sql`limit ${which.limit}`;
    const { rows } = await sql<PageRow>`
      select ${selected} from audit_events where ${where} order by audit_events.seq ${limit}`.execute(trx);
    const wanted = 'seqs' in which ? new Set(which.seqs) : undefined;
    return rows
      .filter((raw) => wanted === undefined || wanted.has(Number(raw.seq)))
      .map((raw) => {
        const row = toWalked(raw, shape);
        const record: LeafRecord = {
          seq: row.seq,
          eventId: row.eventId,
          occurredAt: row.occurredAt,
          canonical: row.canonical,
        };
        if (row.computed !== undefined)
          record.chain = { scheme: row.linked ? 'linked' : 'record', prevHash: row.prevHash, hash: row.hash };
        return record;
      });
  };
}

const LINKED = String(HASH_SCHEME.linked);
const RECORD = String(HASH_SCHEME.record);
const LEAF = String(HASH_SCHEME.leaf);
