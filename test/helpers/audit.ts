import { sql, type Kysely } from 'kysely';
import { OPTIONAL_FIELDS, type AuditRecord } from '../../src/audit/audit-event.js';
import type { DB } from '../../src/db/schema.js';

/** Every optional field of an audit record, null: the start of a record a test writes as an older gateway did. */
export const NO_OPTIONAL_FIELDS = Object.fromEntries(OPTIONAL_FIELDS.map((field) => [field, null])) as Record<
  (typeof OPTIONAL_FIELDS)[number],
  null
>;

/** A `GET /audit/verify` answer without its `tree` part: what the chain's own checks compare. */
export function chainOf<T extends Record<string, unknown>>(body: T): Omit<T, 'tree'> {
  const { tree: _tree, ...chain } = body;
  return chain;
}

/** A record of the linear chain: its link fields present. */
export type ChainRecord = AuditRecord & { prev_hash: string; hash: string };

/** The record as one of the chain, or the test fails: a leaf record has no link to check. */
export function chainRecord(record: AuditRecord): ChainRecord {
  if (record.prev_hash === null || record.hash === null) throw new Error(`record ${record.seq} is not linked`);
  return record as ChainRecord;
}

/** Runs `tamper` with the append-only trigger off, as a superuser could. */
export async function withTriggerOff(db: Kysely<DB>, tamper: () => Promise<unknown>): Promise<void> {
  await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
  try {
    await tamper();
  } finally {
    await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
  }
}
