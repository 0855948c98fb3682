import { createHash } from 'node:crypto';
import { configure } from 'safe-stable-stringify';
import type { AuditRecord } from './audit-event.js';

export const GENESIS_HASH = '0'.repeat(64);

const canonicalJson = configure({ deterministic: true, bigint: false, circularValue: Error });

/**
 * The chain hash of a record: SHA-256 over the canonical JSON of every field but `hash`,
 * `prev_hash` included, so editing, removing or inserting any row breaks the chain after it.
 */
export function chainHash(record: Omit<AuditRecord, 'hash'>): string {
  return createHash('sha256').update(canonicalJson(record) ?? '').digest('hex');
}

/** SHA-256 of a payload's canonical JSON: how payloads are recorded instead of their content. */
export function payloadHash(payload: unknown): string {
  return createHash('sha256').update(canonicalJson(payload ?? null) ?? 'null').digest('hex');
}
