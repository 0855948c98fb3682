import { createHash } from 'node:crypto';
import pg from 'pg';
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { canonicalJson } from '../src/audit/audit-hash.js';
import { closeAuditChain } from '../src/audit/audit-repository.js';
import { leafHash } from '../src/audit/merkle.js';
import { PartitionFileVerifier } from '../src/audit/partition-file.js';
import { hasPostgresServer } from './helpers/database.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { ManualClock } from './helpers/manual-clock.js';
import { days, monthStart, partitionOf } from './helpers/months.js';
import { ed25519Pem } from './helpers/signing-keys.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';

const platform = tokens.platform();
const key = ed25519Pem();
const otherKey = ed25519Pem();

function verifyFile(text: string, options: ConstructorParameters<typeof PartitionFileVerifier>[0]) {
  const verifier = new PartitionFileVerifier(options);
  for (const line of text.trimEnd().split('\n')) verifier.line(line);
  return verifier.end();
}

/** The file with its lines changed by `edit` and its trailer's digest made anew: consistent but for what the edit broke. */
function redigested(text: string, edit: (lines: string[]) => string[]): string {
  const lines = text.trimEnd().split('\n');
  const body = edit(lines.slice(0, -1));
  const digest = createHash('sha256')
    .update(body.map((line) => `${line}\n`).join(''))
    .digest('hex');
  return [...body, canonicalJson({ ...JSON.parse(lines.at(-1)!), lines_sha256: digest })!].join('\n');
}

/*
 * A log that is leaves only (a new gateway's) archives each finished month as a range of the Merkle tree's
 * leaves: docs/design/audit-chain.md#leaf-partitions.
 */
describe.skipIf(!hasPostgresServer)('audit partitions of leaf records (needs a PostgreSQL server)', () => {
  let h: Harness;
  const clock = new ManualClock(new Date(monthStart(1).getTime() + days(4)));
  const [m1, m2, m3] = [monthStart(1), monthStart(2), monthStart(3)];

  const append = (n: number, at: Date, tag: string) => {
    clock.set(at);
    return h.client.app.services.audit.appendMany(
      Array.from({ length: n }, (_, i) => ({
        event_type: 'partition.test',
        actor: `system.${tag}.${i}`,
        details: { i },
      })),
    );
  };
  const partitions = async () =>
    (await h.client.get('/audit/partitions', { token: platform })).body.items as Array<Record<string, any>>;
  const partition = async (name: string) => (await partitions()).find((p) => p.name === name);
  const treeSize = async () =>
    Number(
      (
        await sql<{ n: string | null }>`select max(tree_size) as n from audit_tree_checkpoints`.execute(
          h.db.database.control,
        )
      ).rows[0]!.n ?? 0,
    );
  const recordCount = async () =>
    Number(
      (await sql<{ n: string }>`select count(*) as n from audit_events`.execute(h.db.database.control)).rows[0]!.n,
    );
  const covered = () =>
    until('every record to be a leaf under a checkpoint', async () => (await treeSize()) >= (await recordCount()));
  const seal = (name: string) => h.client.post(`/audit/partitions/${name}/seal`, { token: platform });
  const exportOf = (name: string) => h.client.get(`/audit/partitions/${name}/export`, { token: platform });
  const detach = (name: string, body: Record<string, unknown>) =>
    h.client.post(`/audit/partitions/${name}/detach`, { token: platform, body });

  beforeAll(async () => {
    h = await startHarness(
      { TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem, TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '50' },
      { now: clock.now },
    );
    await h.client.app.services.auditPartitions.addMonthsAhead();
    await append(3, new Date(m1.getTime() + days(4)), 'm1');
    await append(4, new Date(m2.getTime() + days(4)), 'm2');
    await append(2, new Date(m3.getTime() + days(4)), 'm3');
    await covered();
  });
  afterAll(() => h?.close());

  it('writes leaf records only, and lists each finished month as unsealed', async () => {
    const records = await h.client.get('/audit', { token: platform, query: { limit: 50 } });
    expect(new Set(records.body.items.map((r: { hash_scheme: number }) => r.hash_scheme))).toEqual(new Set([3]));
    clock.set(new Date(m3.getTime() + days(40)));
    expect(await partition(partitionOf(m1))).toMatchObject({ state: 'unsealed', first_seq: 1, last_seq: 3 });
    expect(await partition(partitionOf(m2))).toMatchObject({ state: 'unsealed', first_seq: 4, last_seq: 7 });
    expect((await seal(partitionOf(m2))).body).toMatchObject({
      error: { code: 'partition_not_sealed', details: { reason: 'not_oldest' } },
    });
  });

  it('refuses to seal a month while a record of it is not a leaf yet', async () => {
    // The sequencer cannot take the tree's row while another transaction holds it.
    const holder = new pg.Client({ connectionString: h.db.url });
    await holder.connect();
    try {
      await holder.query('begin');
      await holder.query('select * from audit_tree_state where id = 1 for update');
      const now = clock.now();
      const [late] = await append(1, new Date(m1.getTime() + days(20)), 'late');
      clock.set(now);
      expect(late).toMatchObject({ seq: 10, hash_scheme: 3 });
      expect(await partition(partitionOf(m1))).toMatchObject({ state: 'unsealed', last_seq: 10 });
      expect((await seal(partitionOf(m1))).body).toMatchObject({
        error: { code: 'partition_not_sealed', details: { reason: 'unsequenced' } },
      });
    } finally {
      await holder.query('rollback');
      await holder.end();
    }
    await covered();
  });

  let sealed: Record<string, any>;

  it('seals a month at its last leaf with a signed checkpoint, once', async () => {
    const first = await seal(partitionOf(m1));
    expect(first.status, JSON.stringify(first.body)).toBe(201);
    sealed = first.body;
    // The late record of the month is its last leaf, after the other months' records.
    expect(sealed).toMatchObject({ seq: 10, leaf_index: 9, key_id: expect.stringMatching(/^[0-9a-f]{16}$/) });
    const again = await seal(partitionOf(m1));
    expect(again.status).toBe(200);
    expect(again.body).toEqual(sealed);
    expect(await partition(partitionOf(m1))).toMatchObject({ state: 'sealed', checkpoint_id: sealed.id });
    // A seal of leaves is no checkpoint of the chain to verify from.
    const from = await h.client.get('/audit/verify', { token: platform, query: { from_checkpoint: sealed.id } });
    expect(from.status).toBe(404);
  });

  let file: string;

  it("exports the month's range of leaves, which verifies offline with the public key alone", async () => {
    const exported = await exportOf(partitionOf(m1));
    expect(exported.status).toBe(200);
    file = exported.text;
    const lines = file.trimEnd().split('\n');
    const header = JSON.parse(lines[0]!);
    // Leaves 0–9: the month's own three, the next two months' six sequenced before its late one, and that one.
    expect(header).toMatchObject({
      format: 'toolgate-audit-partition-v4',
      first_leaf_index: 0,
      last_leaf_index: 9,
      first_seq: 1,
      last_seq: 10,
      rows: 10,
      last_hash: sealed.hash,
      tree: { first_leaf_index: 0, left: [] },
    });
    expect(lines).toHaveLength(12);
    const records = lines.slice(1, -1).map((line) => JSON.parse(line));
    expect(records.map((r) => r.leaf_index)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    expect(records.every((r) => r.hash_scheme === 3 && r.hash === undefined)).toBe(true);
    // A leaf's hash is SHA-256 of 0x00 and the record's content: what any RFC 9162 verifier computes.
    const { seq: _s, leaf_index: _l, hash_scheme: _h, ...content } = records[9];
    expect(leafHash(canonicalJson(content)!).toString('hex')).toBe(sealed.hash);
    expect(JSON.parse(lines.at(-1)!)).toMatchObject({ type: 'trailer', checkpoint: { id: sealed.id, leaf_index: 9 } });

    expect(verifyFile(file, { publicKeyPem: key.publicPem })).toMatchObject({
      ok: true,
      checked: 10,
      signature_checked: true,
      tree: { tree_size: header.tree.tree_size, first_leaf_index: 0 },
    });
    const logKey = (await h.client.get('/audit/log-info', { token: platform })).body.verifier_key as string;
    expect(verifyFile(file, { publicKeyPem: key.publicPem, logKey })).toMatchObject({ ok: true });
    expect(verifyFile(file, { publicKeyPem: otherKey.publicPem })).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/not signed by the log key/),
    });
    expect(verifyFile(file, {})).toMatchObject({ ok: false, reason: expect.stringMatching(/key is needed/) });
  });

  it('finds a record edited, dropped or reordered in the file, or a header that is not the seal', () => {
    const check = (text: string) => verifyFile(text, { publicKeyPem: key.publicPem });
    // One byte of a record, the digest made anew: the leaves no longer make the signed root.
    const edited = redigested(file, (lines) =>
      lines.map((l) => l.replace('"actor":"system.m2.1"', '"actor":"system.m2.2"')),
    );
    expect(check(edited)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/not the leaves the signed tree holds/),
    });
    // Without the digest made anew, the trailer catches it first.
    expect(check(file.replace('"actor":"system.m2.1"', '"actor":"system.m2.2"'))).toMatchObject({ ok: false });
    const dropped = redigested(file, (lines) => [lines[0]!, ...lines.slice(2)]);
    expect(check(dropped)).toMatchObject({
      ok: false,
      first_bad_line: 2,
      reason: expect.stringMatching(/leaf 1 where 0/),
    });
    const swapped = redigested(file, (lines) => [lines[0]!, lines[2]!, lines[1]!, ...lines.slice(3)]);
    expect(check(swapped)).toMatchObject({ ok: false, first_bad_line: 2 });
    // A header naming another end than the seal's.
    const header = JSON.parse(file.split('\n')[0]!);
    const moved = redigested(file, (lines) => [canonicalJson({ ...header, last_seq: 9 })!, ...lines.slice(1)]);
    expect(check(moved)).toMatchObject({ ok: false, reason: expect.stringMatching(/seq/) });
    expect(check(file.split('\n').slice(0, 5).join('\n'))).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/trailer/),
    });
  });

  it('detaches the month once it ends at the record named as exported; the tree still verifies', async () => {
    const header = JSON.parse(file.split('\n')[0]!);
    const mismatch = await detach(partitionOf(m1), { last_seq: header.last_seq, last_hash: '0'.repeat(64) });
    expect(mismatch.body).toMatchObject({ error: { code: 'partition_not_sealed', details: { reason: 'mismatch' } } });
    const detached = await detach(partitionOf(m1), { last_seq: header.last_seq, last_hash: header.last_hash });
    expect(detached.status, JSON.stringify(detached.body)).toBe(200);
    expect(detached.body).toMatchObject({ state: 'detached', first_seq: 1, last_seq: 10, rows: 10 });
    expect(await partition(partitionOf(m1))).toMatchObject({ state: 'detached', checkpoint_id: sealed.id });
    const report = await h.client.get('/audit', {
      token: platform,
      query: { event_type: 'audit.partition_detached' },
    });
    expect(report.body.items[0].details).toMatchObject({ partition: partitionOf(m1), from_leaf: 0, to_leaf: 9 });
    await covered();
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: true, tree: { ok: true } });
    // The next months' records in the detached range stay with their months.
    expect(await partition(partitionOf(m2))).toMatchObject({ first_seq: 4, last_seq: 7 });
  });

  it('archives the next month from the leaf after the last range, even when all its records sit before it', async () => {
    // Every record of month 2 is among leaves 0–9, archived with month 1: nothing is left for it to archive.
    expect((await seal(partitionOf(m2))).body).toMatchObject({
      error: { code: 'partition_not_sealed', details: { reason: 'empty' } },
    });
    expect(await partition(partitionOf(m2))).toMatchObject({ state: 'empty' });
  });

  it('archives the next range from the leaf after the last, with the subtrees before it as evidence', async () => {
    // Month 4 holds the records of sealing and detaching month 1; months 2 and 3, already archived, hold it back no more.
    const m4 = monthStart(4);
    clock.set(new Date(m4.getTime() + days(40)));
    await h.client.app.services.auditPartitions.addMonthsAhead();
    await covered();
    const sealed4 = await seal(partitionOf(m4));
    expect(sealed4.status, JSON.stringify(sealed4.body)).toBe(201);
    const exported = await exportOf(partitionOf(m4));
    const header = JSON.parse(exported.text.split('\n')[0]!);
    expect(header).toMatchObject({ first_leaf_index: 10, last_leaf_index: sealed4.body.leaf_index });
    expect(header.tree.left.length).toBeGreaterThan(0);
    expect(verifyFile(exported.text, { publicKeyPem: key.publicPem })).toMatchObject({
      ok: true,
      checked: sealed4.body.leaf_index - 9,
    });
    // Another month's seal does not close this one's file.
    const trailer = JSON.parse(exported.text.trimEnd().split('\n').at(-1)!);
    const foreign = exported.text.replace(JSON.stringify(trailer.checkpoint), JSON.stringify(sealed));
    expect(
      verifyFile(
        redigested(foreign, (lines) => lines),
        { publicKeyPem: key.publicPem },
      ),
    ).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/seal is not at the last leaf/),
    });
  });

  it('refuses verification when a range of leaves is archived without its report in the log', async () => {
    await sql`
      insert into audit_partition_archives
        (event_seq, partition, from_seq, to_seq, prev_hash, first_hash, last_hash, row_count, checkpoint_id,
         detached_by, detached_at, from_leaf, to_leaf, last_leaf_hash)
      values (1000, 'audit_events_forged', 1000, 1000, null, ${'0'.repeat(64)}, ${'0'.repeat(64)}, 1, 'x',
        'someone', now(), 100, 100, ${'0'.repeat(64)})`.execute(h.db.database.control);
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({
      ok: false,
      tree: { ok: false, first_bad_leaf_index: 100, reason: 'record_missing' },
    });
  });
});

/*
 * A log written before the chain closed: its chain's months are archived as ranges of the chain, the month it
 * closed in as a range of leaves holding the chain's last records, and the months after as leaves only.
 */
describe.skipIf(!hasPostgresServer)('the month the chain closed in (needs a PostgreSQL server)', () => {
  let h: Harness;
  const clock = new ManualClock(new Date(monthStart(1).getTime() + days(4)));
  const [m1, m2, m3] = [monthStart(1), monthStart(2), monthStart(3)];
  let chainEnd: { seq: number; hash: string };

  const append = (n: number, at: Date, tag: string) => {
    clock.set(at);
    return h.client.app.services.audit.appendMany(
      Array.from({ length: n }, (_, i) => ({ event_type: 'partition.test', actor: `system.${tag}.${i}` })),
    );
  };
  const seal = (name: string) => h.client.post(`/audit/partitions/${name}/seal`, { token: platform });
  const exportOf = async (name: string) =>
    (await h.client.get(`/audit/partitions/${name}/export`, { token: platform })).text;
  const detachAs = (name: string, file: string) => {
    const header = JSON.parse(file.split('\n')[0]!);
    return h.client.post(`/audit/partitions/${name}/detach`, {
      token: platform,
      body: { last_seq: header.last_seq, last_hash: header.last_hash },
    });
  };
  const covered = () =>
    until('every record to be a leaf under a checkpoint', async () => {
      const { rows } = await sql<{ size: number; records: number }>`
        select coalesce((select max(tree_size) from audit_tree_checkpoints), 0)::int as size,
          (select count(*) from audit_events)::int as records`.execute(h.db.database.control);
      return rows[0]!.size >= rows[0]!.records;
    });

  beforeAll(async () => {
    h = await startHarness(
      { TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem, TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '50' },
      { now: clock.now, chain: 'open' },
    );
    await h.client.app.services.auditPartitions.addMonthsAhead();
    await append(3, new Date(m1.getTime() + days(4)), 'm1');
    await append(2, new Date(m2.getTime() + days(4)), 'm2.linked');
    chainEnd = await closeAuditChain(h.db.database.control);
    await append(2, new Date(m2.getTime() + days(5)), 'm2.leaf');
    await append(2, new Date(m3.getTime() + days(4)), 'm3');
    await covered();
    clock.set(new Date(m3.getTime() + days(40)));
  });
  afterAll(() => h?.close());

  it("archives the chain's month as a range of the chain, then the month it closed in as leaves with its last records", async () => {
    expect(chainEnd.seq).toBe(5);
    expect((await seal(partitionOf(m1))).status).toBe(201);
    const first = await exportOf(partitionOf(m1));
    expect(JSON.parse(first.split('\n')[0]!)).toMatchObject({ format: 'toolgate-audit-partition-v3', last_seq: 3 });
    expect((await detachAs(partitionOf(m1), first)).status).toBe(200);

    const sealed = await seal(partitionOf(m2));
    expect(sealed.status, JSON.stringify(sealed.body)).toBe(201);
    // Leaves 3–6: the chain's records 4 and 5, then the month's leaf records 6 and 7.
    expect(sealed.body).toMatchObject({ leaf_index: 6, seq: 7 });
    const file = await exportOf(partitionOf(m2));
    const lines = file.trimEnd().split('\n');
    expect(JSON.parse(lines[0]!)).toMatchObject({
      format: 'toolgate-audit-partition-v4',
      first_leaf_index: 3,
      last_leaf_index: 6,
      first_seq: 4,
      last_seq: 7,
      chain: {
        from_seq: 4,
        to_seq: 5,
        prev_hash: JSON.parse(first.split('\n')[0]!).last_hash,
        last_hash: chainEnd.hash,
      },
    });
    expect(lines.slice(1, -1).map((line) => JSON.parse(line).hash_scheme)).toEqual([2, 2, 3, 3]);
    expect(verifyFile(file, { publicKeyPem: key.publicPem })).toMatchObject({ ok: true, checked: 4 });
    // A record of the chain whose link is rewritten (its content, and so its leaf, unchanged).
    const relinked = redigested(file, (body) =>
      body.map((line, i) =>
        i === 2 ? line.replace(/"prev_hash":"[0-9a-f]{64}"/, `"prev_hash":"${'1'.repeat(64)}"`) : line,
      ),
    );
    expect(verifyFile(relinked, { publicKeyPem: key.publicPem })).toMatchObject({
      ok: false,
      first_bad_line: 3,
      reason: expect.stringMatching(/does not chain or hash/),
    });

    expect((await detachAs(partitionOf(m2), file)).status).toBe(200);
    await covered();
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({
      ok: true,
      checked: 0,
      archived: [
        { from_seq: 1, to_seq: 3, partition: partitionOf(m1) },
        { from_seq: 4, to_seq: 5, partition: partitionOf(m2) },
      ],
      tree: { ok: true },
    });
  });

  it('archives the months after it as leaves only, from the leaf after', async () => {
    const sealed = await seal(partitionOf(m3));
    expect(sealed.status, JSON.stringify(sealed.body)).toBe(201);
    expect(sealed.body).toMatchObject({ leaf_index: 8, seq: 9 });
    const file = await exportOf(partitionOf(m3));
    const header = JSON.parse(file.split('\n')[0]!);
    expect(header).toMatchObject({ first_leaf_index: 7, last_leaf_index: 8 });
    expect(header.chain).toBeUndefined();
    expect(verifyFile(file, { publicKeyPem: key.publicPem })).toMatchObject({ ok: true, checked: 2 });
    expect((await detachAs(partitionOf(m3), file)).status).toBe(200);
    await covered();
    expect((await h.client.get('/audit/verify', { token: platform })).body).toMatchObject({
      ok: true,
      tree: { ok: true },
    });
  });
});
