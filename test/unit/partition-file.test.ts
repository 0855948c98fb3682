import { createHash, generateKeyPairSync } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { sealLinked, sealRecord } from '../../src/audit/audit-hash.js';
import type { UnsealedLink } from '../../src/audit/audit-hash.js';
import { CheckpointSigner } from '../../src/audit/checkpoint-signer.js';
import { PARTITION_FILE_FORMAT, PartitionFileVerifier, fileLine } from '../../src/audit/partition-file.js';
import { ed25519Pem } from '../helpers/signing-keys.js';

const { privatePem, publicPem } = ed25519Pem();

function record(seq: number, prevHash: string): UnsealedLink {
  return {
    seq,
    event_id: `00000000-0000-4000-8000-${String(seq).padStart(12, '0')}`,
    occurred_at: new Date(Date.UTC(2027, 0, 1) + seq).toISOString(),
    tenant_id: 't1',
    actor: `agent:a${seq}`,
    agent_id: 'a1',
    event_type: 'tool.call.completed',
    run_id: `run_${seq}`,
    tool_call_id: null,
    tool_id: 'web.fetch',
    tool_version: '1.0.0',
    tool_category: 'read',
    risk_level: 'low',
    trace_id: null,
    organization_id: null,
    assessment_id: null,
    status: 'completed',
    reason_code: null,
    input_sha256: null,
    output_sha256: null,
    duration_ms: 12.5,
    cost_units: 1,
    details: { n: seq / 10 },
    prev_hash: prevHash,
  };
}

/**
 * An export of records 11 to 13, chained from a made-up hash of record 10: by default record 11
 * hashed whole, as before linking in the database, and 12 and 13 linked.
 */
function exportFile(
  signer = new CheckpointSigner({ signingKeyPem: privatePem }),
  seals = [sealRecord, sealLinked, sealLinked],
  format: string = PARTITION_FILE_FORMAT,
): string[] {
  const prevHash = 'a'.repeat(64);
  const lines: string[] = [];
  const hashes: string[] = [];
  let prev = prevHash;
  for (let seq = 11; seq <= 13; seq += 1) {
    const sealed = seals[seq - 11]!(record(seq, prev));
    lines.push(sealed.json);
    hashes.push(sealed.hash);
    prev = sealed.hash;
  }
  const header = fileLine({
    type: 'header',
    format,
    partition: 'audit_events_2027_01',
    range_start: '2027-01-01T00:00:00.000Z',
    range_end: '2027-02-01T00:00:00.000Z',
    first_seq: 11,
    last_seq: 13,
    prev_hash: prevHash,
    first_hash: hashes[0]!,
    last_hash: hashes[2]!,
    rows: 3,
    exported_at: '2027-02-02T00:00:00.000Z',
  });
  const checkpoint = signer.sign({
    id: 'ckpt_1',
    seq: 13,
    hash: hashes[2]!,
    at: '2027-02-02T00:00:00.000Z',
    created_by: 'operator:ops',
  });
  const digest = createHash('sha256')
    .update([header, ...lines].map((line) => `${line}\n`).join(''))
    .digest('hex');
  return [header, ...lines, fileLine({ type: 'trailer', checkpoint, lines_sha256: digest })];
}

function verify(
  lines: string[],
  options: { publicKeyPem?: string; allowUnsigned?: boolean } = { publicKeyPem: publicPem },
) {
  const verifier = new PartitionFileVerifier(options);
  for (const line of lines) verifier.line(line);
  return verifier.end();
}

describe('an exported partition, verified offline', () => {
  it('verifies: every record, the header and the signed checkpoint at the last record', () => {
    expect(verify(exportFile())).toMatchObject({ ok: true, checked: 3, first_bad_line: null, signature_checked: true });
  });

  it('verifies a file of the first format, every record hashed whole', () => {
    expect(
      verify(exportFile(undefined, [sealRecord, sealRecord, sealRecord], 'toolgate-audit-partition-v1')),
    ).toMatchObject({ ok: true, checked: 3 });
  });

  it('finds a record edited, even below what a double can tell apart, whichever its scheme', () => {
    const linked = exportFile();
    linked[2] = linked[2]!.replace('"n":1.2', '"n":1.2000000000000000001');
    expect(verify(linked)).toMatchObject({ ok: false, first_bad_line: 3 });
    const whole = exportFile();
    whole[1] = whole[1]!.replace('"n":1.1', '"n":1.1000000000000000001');
    expect(verify(whole)).toMatchObject({ ok: false, first_bad_line: 2 });
  });

  it('finds a linked record passed off as hashed whole, and a scheme it does not know', () => {
    const relabelled = exportFile();
    relabelled[2] = relabelled[2]!.replace('"hash_scheme":2,', '');
    expect(verify(relabelled)).toMatchObject({ ok: false, first_bad_line: 3 });
    const unknown = exportFile();
    unknown[2] = unknown[2]!.replace('"hash_scheme":2,', '"hash_scheme":3,');
    expect(verify(unknown)).toMatchObject({ ok: false, first_bad_line: 3 });
  });

  it('finds a record removed, repeated or moved', () => {
    const lines = exportFile();
    expect(verify([lines[0]!, lines[1]!, lines[3]!, lines[4]!])).toMatchObject({ ok: false, first_bad_line: 3 });
    expect(verify([lines[0]!, lines[1]!, lines[1]!, lines[2]!, lines[3]!, lines[4]!])).toMatchObject({
      ok: false,
      first_bad_line: 3,
    });
    expect(verify([lines[0]!, lines[2]!, lines[1]!, lines[3]!, lines[4]!])).toMatchObject({
      ok: false,
      first_bad_line: 2,
    });
  });

  it('finds a header that does not match its records, or was edited where nothing else covers it', () => {
    const lines = exportFile();
    const header = JSON.parse(lines[0]!) as Record<string, unknown>;
    const rewritten = (change: Record<string, unknown>) => [
      fileLine({ ...header, ...change } as never),
      ...lines.slice(1),
    ];
    expect(verify(rewritten({ exported_at: '2030-01-01T00:00:00.000Z' }))).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/digests/),
    });
    expect(verify([`${lines[0]!} `, ...lines.slice(1)])).toMatchObject({ ok: false, first_bad_line: 1 });
  });

  it('refuses a checkpoint signed by another key, one not at the last record, and a file cut short', () => {
    const { privateKey: other } = generateKeyPairSync('ed25519');
    const forged = exportFile(
      new CheckpointSigner({ signingKeyPem: other.export({ type: 'pkcs8', format: 'pem' }).toString() }),
    );
    expect(verify(forged)).toMatchObject({ ok: false, reason: expect.stringMatching(/not this one/) });
    const lines = exportFile();
    expect(verify(lines.slice(0, -1))).toMatchObject({ ok: false, reason: expect.stringMatching(/trailer/) });
    expect(verify([...lines, lines[1]!])).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/after the trailer/),
    });
  });

  it('accepts an unsigned checkpoint only when told to, and needs a key for a signed one', () => {
    const unsigned = exportFile(new CheckpointSigner());
    expect(verify(unsigned)).toMatchObject({ ok: false, reason: expect.stringMatching(/unsigned/) });
    expect(verify(unsigned, { allowUnsigned: true })).toMatchObject({ ok: true, signature_checked: false });
    expect(verify(exportFile(), {})).toMatchObject({ ok: false, reason: expect.stringMatching(/public key/) });
  });
});
