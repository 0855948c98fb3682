import { sql, type Kysely, type RawBuilder, type Selectable, type Transaction } from 'kysely';
import type { AuditEventTable, DB } from '../db/schema.js';
import type { AuditRecord } from './audit-event.js';

/** The columns of `audit_events` that hold SHA-256s, as their 32 bytes since migration 0022. */
type HashColumn = 'prev_hash' | 'hash' | 'input_sha256' | 'output_sha256';

/** A hash column as the lowercase hex the rest of toolgate speaks (a null stays null). */
export function hexOf<C extends HashColumn>(column: C): RawBuilder<AuditRecord[C]> {
  return sql`encode(${sql.ref(column)}, 'hex')`;
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
