import { createHash, hash as digest } from 'node:crypto';
import { configure } from 'safe-stable-stringify';
import type { AuditRecord } from './audit-event.js';

export const GENESIS_HASH = '0'.repeat(64);

/** JSON with keys sorted: the form records are hashed (and stored) in. */
export const canonicalJson = configure({ deterministic: true, bigint: false, circularValue: Error });

/**
 * How a row's `hash` is made (its `hash_scheme`). `record`: over the canonical JSON of the whole
 * row. `linked`: over its seq, its predecessor's hash and its content's hash, so that the database
 * can link a record the gateway hashed without knowing where it would fall. `leaf`: none, once the
 * chain is closed: the record is a leaf of the Merkle tree only (its leaf bytes are its content).
 */
export const HASH_SCHEME = { record: 1, linked: 2, leaf: 3 } as const;

/** A record without what `linked` hashing leaves to the database: where it falls in the chain, and how. */
export type AuditContent = Omit<AuditRecord, 'seq' | 'prev_hash' | 'hash' | 'hash_scheme'>;

/**
 * A `record`-scheme record's hash — SHA-256 over the canonical JSON of every field but `hash`,
 * `prev_hash` included — and its JSON with the hash added, from one serialisation (rows of this
 * scheme predate linking in the database; tests and benches still make them).
 */
export function sealRecord(record: Omit<AuditRecord, 'hash' | 'hash_scheme'>): { hash: string; json: string } {
  const canonical = canonicalJson(record) ?? '{}';
  const hash = createHash('sha256').update(canonical).digest('hex');
  return { hash, json: `${canonical.slice(0, -1)},"hash":"${hash}"}` };
}

/** A record's content as canonical JSON, and its SHA-256: what the gateway hashes before the append. */
export function sealContent(content: AuditContent): { contentHash: string; json: string } {
  const json = canonicalJson(content) ?? '{}';
  return { contentHash: digest('sha256', json, 'hex'), json };
}

/**
 * The `linked` scheme's link: SHA-256 of `seq:prev_hash:content_hash` (decimal seq, hex hashes).
 * The append statement computes the same in SQL (`linkSql`); a test pins the two together.
 */
export function linkHash(seq: number, prevHash: string, contentHash: string): string {
  return digest('sha256', `${seq}:${prevHash}:${contentHash}`, 'hex');
}

/** A record of the chain before it is hashed: where it falls in the chain, without its own hash. */
export type UnsealedLink = Omit<AuditRecord, 'hash' | 'hash_scheme' | 'prev_hash'> & { prev_hash: string };

/**
 * A `linked` record's hash and its JSON, `hash` last as an export writes it: what a verifier
 * outside toolgate recomputes, and how tests and benches make rows without the gateway.
 */
export function sealLinked(record: UnsealedLink): { hash: string; json: string } {
  const { seq, prev_hash, ...content } = record;
  const hash = linkHash(seq, prev_hash, sealContent(content).contentHash);
  const canonical = canonicalJson({ ...record, hash_scheme: HASH_SCHEME.linked }) ?? '{}';
  return { hash, json: `${canonical.slice(0, -1)},"hash":"${hash}"}` };
}

/**
 * A payload with its canonical JSON and that JSON's SHA-256 (`payloadHash`), each made once, when first asked for:
 * made where the payload comes in and passed along, so no later step serialises or hashes it again.
 */
export class CanonicalPayload {
  private canonical: string | undefined;
  private hash: string | undefined;

  constructor(readonly value: unknown) {}

  /** The canonical JSON (keys sorted); `null` for a missing payload. */
  get json(): string {
    return (this.canonical ??= canonicalJson(this.value ?? null) ?? 'null');
  }

  get sha256(): string {
    return (this.hash ??= digest('sha256', this.json, 'hex'));
  }
}

/** SHA-256 of a payload's canonical JSON: how payloads are recorded instead of their content. */
export function payloadHash(payload: unknown): string {
  return new CanonicalPayload(payload).sha256;
}
