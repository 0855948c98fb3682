import { describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import {
  canonicalJson,
  GENESIS_HASH,
  linkHash,
  sealContent,
  sealLinked,
  sealRecord,
} from '../../src/audit/audit-hash.js';
import type { UnsealedLink } from '../../src/audit/audit-hash.js';

const unhashed: UnsealedLink = {
  seq: 7,
  event_id: '3f1c2d4e-5a6b-4c7d-8e9f-0a1b2c3d4e5f',
  occurred_at: '2026-11-30T12:00:00.000Z',
  actor: 'agent:t1/a1',
  event_type: 'run.step.completed',
  tenant_id: 't1',
  agent_id: 'a1',
  run_id: 'run-1',
  tool_call_id: 'run-1:0:x',
  tool_id: 'echo',
  tool_version: '1.0.0',
  tool_category: 'read_only',
  risk_level: 'low',
  status: 'completed',
  reason_code: null,
  input_sha256: 'a'.repeat(64),
  output_sha256: null,
  duration_ms: 1.5,
  cost_units: 2,
  trace_id: null,
  organization_id: null,
  assessment_id: null,
  details: { zeta: 1, alpha: { nested: ['x', 'y'] }, quote: 'say "hi"\n' },
  prev_hash: GENESIS_HASH,
};

describe('sealRecord', () => {
  it('hashes the canonical JSON of the whole record, prev_hash included, as the walk recomputes it', () => {
    expect(sealRecord(unhashed).hash).toBe(createHash('sha256').update(canonicalJson(unhashed)!).digest('hex'));
  });

  it('gives the record with its hash as JSON, every field and value intact', () => {
    const { hash, json } = sealRecord(unhashed);
    expect(JSON.parse(json)).toEqual({ ...unhashed, hash });
  });

  it('changes the hash when any field changes', () => {
    expect(sealRecord({ ...unhashed, details: { ...unhashed.details, zeta: 2 } }).hash).not.toBe(
      sealRecord(unhashed).hash,
    );
    expect(sealRecord({ ...unhashed, prev_hash: 'f'.repeat(64) }).hash).not.toBe(sealRecord(unhashed).hash);
  });
});

describe('sealLinked', () => {
  it('links seq, prev_hash and the hash of the rest, as the append statement does', () => {
    const { seq, prev_hash, ...content } = unhashed;
    const contentHash = createHash('sha256').update(sealContent(content).json).digest('hex');
    expect(sealContent(content).contentHash).toBe(contentHash);
    expect(linkHash(seq, prev_hash, contentHash)).toBe(
      createHash('sha256').update(`7:${GENESIS_HASH}:${contentHash}`).digest('hex'),
    );
    expect(sealLinked(unhashed).hash).toBe(linkHash(seq, prev_hash, contentHash));
  });

  it('gives the record with its scheme as canonical JSON, its hash last', () => {
    const { hash, json } = sealLinked(unhashed);
    expect(JSON.parse(json)).toEqual({ ...unhashed, hash_scheme: 2, hash });
    expect(json).toBe(`${canonicalJson({ ...unhashed, hash_scheme: 2 })!.slice(0, -1)},"hash":"${hash}"}`);
  });

  it('changes the hash when any field changes, its place in the chain included', () => {
    const base = sealLinked(unhashed).hash;
    expect(sealLinked({ ...unhashed, details: { ...unhashed.details, zeta: 2 } }).hash).not.toBe(base);
    expect(sealLinked({ ...unhashed, prev_hash: 'f'.repeat(64) }).hash).not.toBe(base);
    expect(sealLinked({ ...unhashed, seq: 8 }).hash).not.toBe(base);
    expect(sealLinked(unhashed).hash).not.toBe(sealRecord(unhashed).hash);
  });
});
