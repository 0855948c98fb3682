import { createHash } from 'node:crypto';
import { configure } from 'safe-stable-stringify';
import type { AuditRecord } from './audit-event.js';

export const GENESIS_HASH = '0'.repeat(64);

/** JSON with keys sorted: the form records are hashed (and stored) in. */
export const canonicalJson = configure({ deterministic: true, bigint: false, circularValue: Error });

/**
 * The chain hash of a record: SHA-256 over the canonical JSON of every field but `hash`,
 * `prev_hash` included, so editing, removing or inserting any row breaks the chain after it.
 */
export function chainHash(record: Omit<AuditRecord, 'hash'>): string {
  return createHash('sha256')
    .update(canonicalJson(record) ?? '')
    .digest('hex');
}

/**
 * A record's chain hash and its JSON with the hash added, from one serialisation: the canonical
 * JSON that is hashed is also what is stored (keys sorted, which the database does not mind).
 */
export function sealRecord(record: Omit<AuditRecord, 'hash'>): { hash: string; json: string } {
  const canonical = canonicalJson(record) ?? '{}';
  const hash = createHash('sha256').update(canonical).digest('hex');
  return { hash, json: `${canonical.slice(0, -1)},"hash":"${hash}"}` };
}

/** SHA-256 of a payload's canonical JSON: how payloads are recorded instead of their content. */
export function payloadHash(payload: unknown): string {
  return createHash('sha256')
    .update(canonicalJson(payload ?? null) ?? 'null')
    .digest('hex');
}
