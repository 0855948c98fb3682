import { spawn } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { NO_OPTIONAL_FIELDS } from './helpers/audit.js';
import { canonicalJson, sealRecord } from '../src/audit/audit-hash.js';
import { NoteSigner } from '../src/audit/signed-note.js';
import { AuditLog } from '../src/audit/audit-log.js';
import { readChainHead } from '../src/audit/audit-repository.js';
import { verifyAuditChain, walkRange } from '../src/audit/chain-verification.js';
import { CheckpointSigner } from '../src/audit/checkpoint-signer.js';
import { PartitionFileVerifier } from '../src/audit/partition-file.js';
import { addMonthPartition, listPartitionRows } from '../src/audit/partition-repository.js';
import { openDatabase, type Database } from '../src/db/database.js';
import { migrate, migrationsDir } from '../src/db/migrate.js';
import { createEmptyDatabaseUrl, hasPostgresServer, migrationsUpTo } from './helpers/database.js';
import { AppClient, startHarness, type Harness, type TestResponse } from './helpers/harness.js';
import { ManualClock } from './helpers/manual-clock.js';
import { days, monthStart, partitionOf } from './helpers/months.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { ed25519Pem } from './helpers/signing-keys.js';

const platform = tokens.platform();

const key = ed25519Pem();
const otherKey = ed25519Pem();

function verifyFile(text: string, publicKeyPem: string | null = key.publicPem, allowUnsigned = false) {
  const verifier = new PartitionFileVerifier({ publicKeyPem: publicKeyPem ?? undefined, allowUnsigned });
  const lines = text.split('\n');
  if (lines.at(-1) === '') lines.pop();
  for (const line of lines) verifier.line(line);
  return verifier.end();
}

describe('audit partitions: monthly, sealed, exported, verified offline and detached', () => {
  let h: Harness;
  const clock = new ManualClock(new Date(monthStart(1).getTime() + days(4)));
  const [m1, m2, m3] = [monthStart(1), monthStart(2), monthStart(3)];

  const append = (n: number, at: Date) => {
    clock.set(at);
    return h.client.app.services.audit.appendMany(
      Array.from({ length: n }, (_, i) => ({ event_type: 'partition.test', actor: `system.${i}`, details: { i } })),
    );
  };
  const partitions = async () =>
    (await h.client.get('/audit/partitions', { token: platform })).body.items as Array<Record<string, any>>;

  beforeAll(async () => {
    h = await startHarness({ TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem }, { now: clock.now, chain: 'open' });
    // What the gateway does in the background soon after start: this month and the next three.
    await h.client.app.services.auditPartitions.addMonthsAhead();
    await append(3, new Date(m1.getTime() + days(4)));
    await append(4, new Date(m2.getTime() + days(4)));
    await append(2, new Date(m3.getTime() + days(4)));
  });
  afterAll(() => h.close());

  it('keeps each month in its own partition and verifies the chain across their boundaries', async () => {
    const listed = await partitions();
    const byName = new Map(listed.map((p) => [p.name, p]));
    expect(byName.get(partitionOf(m1))).toMatchObject({ state: 'unsealed', first_seq: 1, last_seq: 3 });
    expect(byName.get(partitionOf(m2))).toMatchObject({ state: 'unsealed', first_seq: 4, last_seq: 7 });
    expect(byName.get(partitionOf(m3))).toMatchObject({ state: 'open', first_seq: 8, last_seq: 9 });
    expect(byName.get('audit_events_default')).toMatchObject({ state: 'default', first_seq: null });
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: true, checked: 9, first_bad_seq: null, head: { seq: 9 } });
    expect(verified.body.archived).toBeUndefined();
  });

  it('refuses to seal or export what is not ready, naming why', async () => {
    const seal = (name: string) => h.client.post(`/audit/partitions/${name}/seal`, { token: platform });
    expect((await seal(partitionOf(m3))).body).toMatchObject({
      error: { code: 'partition_not_sealed', details: { reason: 'open' } },
    });
    expect((await seal('audit_events_default')).body).toMatchObject({ error: { details: { reason: 'default' } } });
    expect((await seal('audit_events_1999_01')).status).toBe(404);
    expect((await seal('pg_class')).status).toBe(400);
    const exported = await h.client.get(`/audit/partitions/${partitionOf(m1)}/export`, { token: platform });
    expect(exported.status).toBe(409);
    expect(exported.body).toMatchObject({ error: { code: 'partition_not_sealed', details: { reason: 'unsealed' } } });
    // Only a platform-operator sees or moves the log's partitions.
    for (const token of [tokens.tenantOperator('t1'), tokens.agent('a.one', { tenant: 't1' })]) {
      expect((await h.client.get('/audit/partitions', { token })).status).toBe(403);
      expect((await h.client.post(`/audit/partitions/${partitionOf(m1)}/seal`, { token })).status).toBe(403);
      expect((await h.client.get(`/audit/partitions/${partitionOf(m1)}/export`, { token })).status).toBe(403);
    }
    expect((await h.client.get('/audit/partitions')).status).toBe(401);
    // A detach names the exported file's last record, exactly.
    for (const body of [
      {},
      { last_seq: 0, last_hash: '0'.repeat(64) },
      { last_seq: 3, last_hash: 'x' },
      { last_seq: 3, last_hash: '0'.repeat(64), extra: 1 },
    ]) {
      const refused = await h.client.post(`/audit/partitions/${partitionOf(m1)}/detach`, { token: platform, body });
      expect(refused.status).toBe(400);
      expect(refused.body).toMatchObject({ error: { code: 'invalid_request' } });
    }
  });

  it('seals a month that is over with a signed checkpoint at its last record, once', async () => {
    clock.set(new Date(m3.getTime() + days(40)));
    const sealed = await h.client.post(`/audit/partitions/${partitionOf(m1)}/seal`, { token: platform });
    expect(sealed.status).toBe(201);
    expect(sealed.body).toMatchObject({ seq: 3, key_id: expect.stringMatching(/^[0-9a-f]{16}$/) });
    const again = await h.client.post(`/audit/partitions/${partitionOf(m1)}/seal`, { token: platform });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(sealed.body);
    expect((await partitions()).find((p) => p.name === partitionOf(m1))).toMatchObject({
      state: 'sealed',
      checkpoint_id: sealed.body.id,
    });
  });

  it('exports a sealed month that verifies offline, and finds one byte changed in it', async () => {
    const exported = await h.client.get(`/audit/partitions/${partitionOf(m1)}/export`, { token: platform });
    expect(exported.status).toBe(200);
    expect(exported.headers['content-type']).toContain('application/x-ndjson');
    const lines = exported.text.trimEnd().split('\n');
    expect(lines).toHaveLength(5);
    expect(JSON.parse(lines[0]!)).toMatchObject({ type: 'header', first_seq: 1, last_seq: 3, rows: 3 });
    expect(JSON.parse(lines[4]!)).toMatchObject({ type: 'trailer', checkpoint: { seq: 3 } });

    const verified = verifyFile(exported.text);
    expect(verified).toMatchObject({ ok: true, checked: 3, first_bad_line: null, signature_checked: true });

    // One byte of the second record: its actor system.1 becomes system.2.
    const edited = exported.text.replace('"actor":"system.1"', '"actor":"system.2"');
    expect(edited).not.toBe(exported.text);
    expect(verifyFile(edited)).toMatchObject({ ok: false, first_bad_line: 3 });
    // A byte of the header (an informational field) is caught by the trailer's digest.
    const header = exported.text
      .replace('"type":"header"', '"type":"header"')
      .replace('"exported_at":"2', '"exported_at":"3');
    expect(verifyFile(header)).toMatchObject({ ok: false });
    // Cut short: no trailer.
    expect(verifyFile(lines.slice(0, 3).join('\n'))).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/trailer/),
    });
  });

  it("carries the Merkle tree's evidence: its records verify offline as leaves of the log's signed tree", async () => {
    const logKey = (await h.client.get('/audit/log-info', { token: platform })).body.verifier_key as string;
    const exportOf = async () =>
      (await h.client.get(`/audit/partitions/${partitionOf(m1)}/export`, { token: platform })).text;
    await until(
      'the month to be covered by a checkpoint',
      async () => JSON.parse((await exportOf()).split('\n')[0]!).tree,
    );
    const text = await exportOf();
    const lines = text.trimEnd().split('\n');
    const header = JSON.parse(lines[0]!);
    expect(header).toMatchObject({ format: 'toolgate-audit-partition-v3', tree: { first_leaf_index: 0, left: [] } });
    expect(header.tree.right.length).toBeGreaterThan(0);
    const withLog = (file: string, verifierKey = logKey) => {
      const verifier = new PartitionFileVerifier({ publicKeyPem: key.publicPem, logKey: verifierKey });
      for (const line of file.trimEnd().split('\n')) verifier.line(line);
      return verifier.end();
    };
    expect(withLog(text)).toMatchObject({
      ok: true,
      checked: 3,
      tree: { tree_size: header.tree.tree_size, first_leaf_index: 0 },
    });
    // Another log's key.
    const stranger = NoteSigner.fromNoteKey(
      'PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz',
    ).verifierKey;
    expect(withLog(text, stranger)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/not signed by the log key/),
    });
    // Evidence that does not lead to the signed root, the file otherwise consistent (its digest made anew).
    const relinked = (edited: Record<string, unknown>) => {
      const body = [canonicalJson(edited)!, ...lines.slice(1, -1)];
      const digest = createHash('sha256')
        .update(body.map((line) => `${line}\n`).join(''))
        .digest('hex');
      return [...body, canonicalJson({ ...JSON.parse(lines.at(-1)!), lines_sha256: digest })!].join('\n');
    };
    const right = [Buffer.alloc(32, 9).toString('base64'), ...header.tree.right.slice(1)];
    expect(withLog(relinked({ ...header, tree: { ...header.tree, right } }))).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/not the leaves the signed tree holds/),
    });
    expect(withLog(relinked({ ...header, tree: undefined }))).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/no Merkle tree evidence/),
    });
    // Without a log key, the chain's checks alone, as before.
    expect(verifyFile(text)).toMatchObject({ ok: true, tree: null });
  });

  it('refuses an export whose checkpoint is forged, or checked against another key', async () => {
    const exported = await h.client.get(`/audit/partitions/${partitionOf(m1)}/export`, { token: platform });
    const lines = exported.text.trimEnd().split('\n');
    const trailer = JSON.parse(lines.at(-1)!);
    // Signed by a key that is not the gateway's, under the gateway's key id.
    const forger = new CheckpointSigner({ signingKeyPem: otherKey.privatePem });
    const forged = forger.sign({ ...trailer.checkpoint, key_id: undefined, signature: undefined });
    const withForgery = { ...trailer, checkpoint: { ...forged, key_id: trailer.checkpoint.key_id } };
    const keys = Object.keys(withForgery).sort();
    const forgedLine = JSON.stringify(Object.fromEntries(keys.map((k) => [k, sortKeys(withForgery[k])])));
    const result = verifyFile([...lines.slice(0, -1), forgedLine].join('\n'));
    expect(result).toMatchObject({ ok: false, reason: expect.stringMatching(/signature/) });
    expect(verifyFile(exported.text, otherKey.publicPem)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/not this one/),
    });
    expect(verifyFile(exported.text, null)).toMatchObject({ ok: false, reason: expect.stringMatching(/key/) });
  });

  it('detaches an exported month, and verification reports its range as archived and goes on past it', async () => {
    const name = partitionOf(m1);
    const exported = await h.client.get(`/audit/partitions/${name}/export`, { token: platform });
    const header = JSON.parse(exported.text.split('\n')[0]!);
    const wrong = await h.client.post(`/audit/partitions/${name}/detach`, {
      token: platform,
      body: { last_seq: header.last_seq, last_hash: '0'.repeat(64) },
    });
    expect(wrong.status).toBe(409);
    expect(wrong.body).toMatchObject({ error: { code: 'partition_not_sealed', details: { reason: 'mismatch' } } });

    const detached = await h.client.post(`/audit/partitions/${name}/detach`, {
      token: platform,
      body: { last_seq: header.last_seq, last_hash: header.last_hash },
    });
    expect(detached.status).toBe(200);
    expect(detached.body).toMatchObject({ name, state: 'detached', first_seq: 1, last_seq: 3, rows: 3 });

    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({
      ok: true,
      first_bad_seq: null,
      archived: [{ from_seq: 1, to_seq: 3, partition: name }],
    });
    expect(verified.body.checked).toBe(verified.body.head.seq - 3);

    const events = await h.client.get('/audit', { token: platform, query: { event_type: 'audit.partition_detached' } });
    expect(events.body.items[0]).toMatchObject({
      seq: detached.body.detached.event_seq,
      details: { partition: name, from_seq: 1, to_seq: 3, last_hash: header.last_hash },
    });
    expect((await partitions()).find((p) => p.name === name)).toMatchObject({ state: 'detached' });
    // Nothing was deleted: the table is still there, detached, for the operator to drop.
    const kept = await sql<{ n: number }>`select count(*)::int as n from ${sql.table(name)}`.execute(
      h.db.database.control,
    );
    expect(kept.rows[0]!.n).toBe(3);
    // Detached once only.
    const twice = await h.client.post(`/audit/partitions/${name}/detach`, {
      token: platform,
      body: { last_seq: header.last_seq, last_hash: header.last_hash },
    });
    expect(twice.body).toMatchObject({ error: { code: 'partition_not_sealed', details: { reason: 'detached' } } });
  });

  it('verifies from a checkpoint and with an anchor across an archived range', async () => {
    const checkpoints = await h.client.get('/audit/checkpoints', { token: platform });
    const sealOfM1 = checkpoints.body.items.find((c: { seq: number }) => c.seq === 3);
    const fromSeal = await h.client.get('/audit/verify', { token: platform, query: { from_checkpoint: sealOfM1.id } });
    expect(fromSeal.body).toMatchObject({ ok: true, from_checkpoint: { seq: 3 } });
    const anchored = await h.client.get('/audit/verify', {
      token: platform,
      query: { anchor_seq: 3, anchor_hash: sealOfM1.hash },
    });
    expect(anchored.body).toMatchObject({ ok: true, anchor: { ok: true, reason: null } });
  });

  it('seals, exports and detaches the next month too, chaining from the archived one', async () => {
    const name = partitionOf(m2);
    expect((await h.client.post(`/audit/partitions/${name}/seal`, { token: platform })).status).toBe(201);
    const exported = await h.client.get(`/audit/partitions/${name}/export`, { token: platform });
    const file = verifyFile(exported.text);
    expect(file).toMatchObject({ ok: true, checked: 4, header: { first_seq: 4, last_seq: 7 } });
    const detached = await h.client.post(`/audit/partitions/${name}/detach`, {
      token: platform,
      body: { last_seq: 7, last_hash: file.header!.last_hash },
    });
    expect(detached.status).toBe(200);
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({
      ok: true,
      archived: [
        { from_seq: 1, to_seq: 3 },
        { from_seq: 4, to_seq: 7 },
      ],
    });
  });

  it('detaches a month holding the records of earlier detachments, and still verifies', async () => {
    const m4 = monthStart(4);
    clock.set(new Date(monthStart(5).getTime() + days(2)));
    await h.client.app.services.auditPartitions.addMonthsAhead();
    for (const name of [partitionOf(m3), partitionOf(m4)]) {
      expect((await h.client.post(`/audit/partitions/${name}/seal`, { token: platform })).status).toBe(201);
      const file = verifyFile((await h.client.get(`/audit/partitions/${name}/export`, { token: platform })).text);
      expect(file.ok).toBe(true);
      const detached = await h.client.post(`/audit/partitions/${name}/detach`, {
        token: platform,
        body: { last_seq: file.header!.last_seq, last_hash: file.header!.last_hash },
      });
      expect(detached.status).toBe(200);
    }
    // The month archived last held the records of the first two detachments.
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: true });
    expect(verified.body.archived.map((r: { partition: string }) => r.partition)).toEqual(
      [m1, m2, m3, m4].map(partitionOf),
    );
  });

  it('reports rows removed behind a range recorded as archived without its detachment record', async () => {
    const name = partitionOf(monthStart(6));
    await append(2, new Date(monthStart(6).getTime() + days(2)));
    const db = h.db.database.control;
    const rows = await sql<{ seq: string; prev_hash: string; hash: string }>`
      select seq, encode(prev_hash, 'hex') as prev_hash, encode(hash, 'hex') as hash
      from ${sql.table(name)} order by seq`.execute(db);
    const first = rows.rows[0]!;
    const last = rows.rows.at(-1)!;
    // Someone with the database's keys detaches a month and records it as archived, with no audit
    // record of it: first naming a record of its own range, then one in a range archived since.
    await sql`alter table audit_events detach partition ${sql.table(name)}`.execute(db);
    const forge = (eventSeq: string | number) => sql`insert into audit_partition_archives values (${eventSeq}, ${name},
      ${first.seq}, ${last.seq}, ${first.prev_hash}, ${first.hash}, ${last.hash}, ${rows.rows.length}, 'ckpt_none',
      'operator:mallory', now())`;
    await forge(first.seq).execute(db);
    const verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: false, first_bad_seq: Number(first.seq), head: null });

    const m4 = (await partitions()).find((p) => p.name === partitionOf(monthStart(4)))!;
    await sql`alter table audit_partition_archives disable trigger audit_partition_archives_no_update_delete`.execute(
      db,
    );
    await sql`delete from audit_partition_archives where partition = ${name}`.execute(db);
    await forge(m4.first_seq).execute(db);
    const again = await h.client.get('/audit/verify', { token: platform });
    expect(again.body).toMatchObject({ ok: false, first_bad_seq: Number(first.seq), head: null });
  });
});

describe('audit partitions whose records interleave at a month boundary', () => {
  let h: Harness;
  const [m1, m2, m3] = [monthStart(1), monthStart(2), monthStart(3)];
  const clock = new ManualClock(new Date(m1.getTime() + days(4)));
  const append = (actor: string, at: Date) => {
    clock.set(at);
    return h.client.app.services.audit.append({ event_type: 'partition.test', actor });
  };
  const archive = async (name: string, before?: (detach: () => Promise<TestResponse>) => Promise<void>) => {
    const sealed = await h.client.post(`/audit/partitions/${name}/seal`, { token: platform });
    expect(sealed.status).toBe(201);
    const file = verifyFile((await h.client.get(`/audit/partitions/${name}/export`, { token: platform })).text);
    expect(file.ok).toBe(true);
    const detach = () =>
      h.client.post(`/audit/partitions/${name}/detach`, {
        token: platform,
        body: { last_seq: file.header!.last_seq, last_hash: file.header!.last_hash },
      });
    await before?.(detach);
    expect((await detach()).status).toBe(200);
    return file;
  };
  // A long read of the log (a verification) holds it: the detach gives up after its lock timeout.
  const holdingARead = async (detach: () => Promise<TestResponse>) => {
    if (!h.db.url) return;
    const reader = new pg.Client({ connectionString: h.db.url });
    await reader.connect();
    try {
      await reader.query('begin');
      await reader.query('select 1 from audit_events limit 1');
      const busy = await detach();
      expect(busy.status).toBe(503);
      expect(busy.body).toMatchObject({ error: { code: 'gateway_unavailable' } });
      await reader.query('rollback');
    } finally {
      await reader.end();
    }
  };

  beforeAll(async () => {
    h = await startHarness({ TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem }, { now: clock.now, chain: 'open' });
    await h.client.app.services.auditPartitions.addMonthsAhead();
    await append('system.1', new Date(m1.getTime() + days(4)));
    await append('system.2', new Date(m1.getTime() + days(5)));
    // Seq 3 is dated just after midnight, seq 4 (a replica whose clock lags) just before.
    await append('system.3', new Date(m2.getTime() + 1000));
    await append('system.4', new Date(m2.getTime() - 1000));
    await append('system.5', new Date(m2.getTime() + days(2)));
  });
  afterAll(() => h.close());

  it("archives the oldest month first, its file holding the neighbour's record inside its range", async () => {
    clock.set(new Date(m3.getTime() + days(2)));
    const early = await h.client.post(`/audit/partitions/${partitionOf(m2)}/seal`, { token: platform });
    expect(early.body).toMatchObject({ error: { code: 'partition_not_sealed', details: { reason: 'not_oldest' } } });

    const first = await archive(partitionOf(m1));
    expect(first).toMatchObject({ checked: 4, header: { first_seq: 1, last_seq: 4 } });
    // Seq 3 stays attached with its month; verification crosses the range and goes on.
    let verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({ ok: true, archived: [{ from_seq: 1, to_seq: 4 }] });

    const second = await archive(partitionOf(m2), holdingARead);
    expect(second).toMatchObject({ checked: 1, header: { first_seq: 5, last_seq: 5 } });
    verified = await h.client.get('/audit/verify', { token: platform });
    expect(verified.body).toMatchObject({
      ok: true,
      archived: [
        { from_seq: 1, to_seq: 4 },
        { from_seq: 5, to_seq: 5 },
      ],
    });
  });
});

const logger = pino({ level: 'silent' });
const root = new URL('..', import.meta.url).pathname;

/** `toolgate …` as an operator runs it: the package's bin, against `url`. */
function toolgate(url: string, args: string[]): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [join(root, 'bin', 'toolgate.js'), ...args], {
      cwd: root,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, TOOLGATE_URL: url, TOOLGATE_TOKEN: platform },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

describe('toolgate audit: partitions, seal, export, verify-file and detach', () => {
  let h: Harness;
  let url: string;
  const clock = new ManualClock(new Date(monthStart(1).getTime() + days(3)));
  const dir = mkdtempSync(join(tmpdir(), 'toolgate-archive-'));
  const publicKey = join(dir, 'public.pem');
  const name = partitionOf(monthStart(1));

  beforeAll(async () => {
    writeFileSync(publicKey, key.publicPem);
    h = await startHarness({ TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem }, { now: clock.now, chain: 'open' });
    await h.client.app.services.audit.appendMany([
      { event_type: 'partition.test', actor: 'system.a', details: { n: 1.5 } },
      { event_type: 'partition.test', actor: 'system.b' },
    ]);
    // Half an hour into the next month: the last is not over yet for sealing (an hour's grace).
    clock.set(new Date(monthStart(2).getTime() + 30 * 60 * 1000));
    await h.client.app.services.audit.appendMany([{ event_type: 'partition.test', actor: 'system.c' }]);
    url = await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  }, 60_000);
  afterAll(() => h.close());

  it('archives a month from the command line, refusing a file that does not verify', async () => {
    const listed = await toolgate(url, ['--json', 'audit', 'partitions']);
    expect(listed.status).toBe(0);
    expect(JSON.parse(listed.stdout).items.find((p: { name: string }) => p.name === name)).toMatchObject({
      state: 'open',
    });
    const early = await toolgate(url, ['audit', 'seal', name]);
    expect(early).toMatchObject({ status: 1, stderr: expect.stringContaining('partition_not_sealed') });
    const unsealed = await toolgate(url, ['audit', 'export', name, '--out', join(dir, 'early.jsonl')]);
    expect(unsealed).toMatchObject({ status: 1, stderr: expect.stringContaining('partition_not_sealed') });

    clock.set(new Date(monthStart(2).getTime() + days(10)));
    expect((await toolgate(url, ['audit', 'seal', name])).stdout).toContain(`${name} sealed by checkpoint`);
    const file = join(dir, `${name}.jsonl`);
    expect((await toolgate(url, ['audit', 'export', name, '--out', file])).status).toBe(0);

    const verified = await toolgate(url, ['audit', 'verify-file', file, '--key', publicKey]);
    expect(verified).toMatchObject({ status: 0, stdout: expect.stringContaining('intact, 2 records') });
    const tampered = join(dir, 'tampered.jsonl');
    writeFileSync(tampered, readFileSync(file, 'utf8').replace('"n":1.5', '"n":1.6'));
    const broken = await toolgate(url, ['audit', 'verify-file', tampered, '--key', publicKey]);
    expect(broken).toMatchObject({ status: 1, stdout: expect.stringContaining('BROKEN at line 2') });
    expect((await toolgate(url, ['audit', 'detach', name, '--file', tampered, '--key', publicKey])).status).toBe(1);
    expect((await h.client.get('/audit/verify', { token: platform })).body.archived).toBeUndefined();

    const detached = await toolgate(url, ['audit', 'detach', name, '--file', file, '--key', publicKey]);
    expect(detached).toMatchObject({ status: 0, stdout: expect.stringContaining(`${name} detached: seq 1-2`) });
    const chain = await toolgate(url, ['audit', 'verify']);
    expect(chain).toMatchObject({ status: 0, stdout: expect.stringContaining(`seq 1-2 archived (${name})`) });
  }, 60_000);
});

async function appendAt(database: Database, at: string | Date, n = 1): Promise<void> {
  const clock = new ManualClock(at);
  await new AuditLog(database, { now: clock.now }).appendMany(
    Array.from({ length: n }, (_, i) => ({ event_type: 'partition.test', actor: `system.${i}` })),
  );
}

/** Appends as gateways did before migration 0019: each record hashed whole (scheme 1), after the head it locks. */
async function appendWholeHashedAt(database: Database, at: string | Date, n = 1): Promise<void> {
  await database.control.transaction().execute(async (trx) => {
    const head = await readChainHead(trx);
    let { seq, hash } = head;
    for (let i = 0; i < n; i += 1) {
      seq += 1;
      const sealed = sealRecord({
        ...NO_OPTIONAL_FIELDS,
        seq,
        event_id: randomUUID(),
        occurred_at: new Date(at).toISOString(),
        actor: `system.${i}`,
        event_type: 'partition.test',
        details: {},
        prev_hash: hash,
      });
      await sql`insert into audit_events select * from jsonb_populate_record(null::audit_events, ${sealed.json}::jsonb)`.execute(
        trx,
      );
      hash = sealed.hash;
    }
    await trx.updateTable('audit_chain_head').set({ seq, hash }).where('id', '=', 1).execute();
  });
}

describe.skipIf(!hasPostgresServer)('migration 0017 on a populated log', () => {
  it('turns the table into partitions in place, keeps it append-only, and the chain verifies across them', async () => {
    const empty = await createEmptyDatabaseUrl();
    const database = await openDatabase({ databaseUrl: empty.url, dataDir: '', poolSize: 3, logger });
    try {
      const dir = migrationsUpTo('0016_audit_checkpoints.sql');
      await migrate(database.control, dir);
      await appendWholeHashedAt(database, '2020-03-01T10:00:00.000Z', 2);
      await appendWholeHashedAt(database, new Date(), 2);
      // A clock a little ahead has written a row of next month: the first partition holds that month too.
      await appendWholeHashedAt(database, new Date(monthStart(1).getTime() + 60 * 60 * 1000));
      // A clock far ahead: the row goes to the default partition, not into a future month's.
      await appendWholeHashedAt(database, '2099-01-15T00:00:00.000Z');
      copyFileSync(join(migrationsDir, '0017_audit_partitions.sql'), join(dir, '0017_audit_partitions.sql'));
      expect((await migrate(database.control, dir)).applied).toEqual(['0017_audit_partitions']);

      const parts = await listPartitionRows(database.control);
      const legacy = parts.find((p) => p.name.startsWith('audit_events_before_'))!;
      expect(legacy).toMatchObject({ first_seq: 1, last_seq: 5, range_start: null, range_end: monthStart(2) });
      expect(parts.find((p) => p.is_default)).toMatchObject({ first_seq: 6, last_seq: 6 });
      expect(parts.filter((p) => /^audit_events_\d{4}_\d\d$/.test(p.name)).map((p) => p.name)).toEqual(
        [2, 3].map((m) => partitionOf(monthStart(m))),
      );
      expect(await verifyAuditChain(database.control)).toMatchObject({ ok: true, checked: 6 });

      // Appends go on, into whichever partition holds their month, as leaf records after the later
      // migrations (the last closes the chain): the chain verifies across records of both its schemes.
      expect((await migrate(database.control)).applied).toEqual(
        readdirSync(migrationsDir)
          .filter((file) => file > '0017_audit_partitions.sql' && file.endsWith('.sql'))
          .map((file) => file.replace(/\.sql$/, '')),
      );
      await appendAt(database, new Date());
      await appendAt(database, new Date(monthStart(2).getTime() + days(1)));
      expect(await verifyAuditChain(database.control)).toMatchObject({ ok: true, checked: 6 });
      const schemes = await sql<{ seq: string; hash_scheme: number }>`
        select seq, hash_scheme from audit_events order by seq`.execute(database.control);
      expect(schemes.rows.map((row) => row.hash_scheme)).toEqual([1, 1, 1, 1, 1, 1, 3, 3]);

      expect(await addMonthPartition(database.control, new Date('2099-01-20T00:00:00Z'))).toBe('default_has_rows');
      expect(await addMonthPartition(database.control, new Date('2020-03-20T00:00:00Z'))).toBe('overlaps');
      expect(await addMonthPartition(database.control, monthStart(1))).toBe('overlaps');
      expect(await addMonthPartition(database.control, monthStart(5))).toBe('created');
      expect(await addMonthPartition(database.control, monthStart(5))).toBe('exists');

      for (const table of ['audit_events', legacy.name, 'audit_events_default', partitionOf(monthStart(2))]) {
        await expect(sql`update ${sql.table(table)} set actor = 'x'`.execute(database.control)).rejects.toThrow(
          /append-only/,
        );
        await expect(sql`delete from ${sql.table(table)}`.execute(database.control)).rejects.toThrow(/append-only/);
        await expect(sql`truncate ${sql.table(table)}`.execute(database.control)).rejects.toThrow(/append-only/);
      }
      await expect(sql`truncate ${sql.table(partitionOf(monthStart(5)))}`.execute(database.control)).rejects.toThrow(
        /append-only/,
      );
    } finally {
      await database.close();
      await empty.drop();
    }
  });
});

describe('audit partitions on the embedded database (PGlite)', () => {
  it('migrates, appends across months, seals, exports, detaches and verifies', async () => {
    const database = await openDatabase({ databaseUrl: undefined, dataDir: 'memory://', poolSize: 1, logger });
    const clock = new ManualClock(new Date(monthStart(1).getTime() + days(2)));
    let client: AppClient | undefined;
    try {
      await migrate(database.control);
      client = await AppClient.start(database, { TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem }, { now: clock.now });
      const audit = client.app.services.audit;
      await audit.appendMany([{ event_type: 'partition.test', actor: 'system.a' }]);
      clock.set(new Date(monthStart(2).getTime() + days(2)));
      await audit.appendMany([{ event_type: 'partition.test', actor: 'system.b' }]);
      clock.set(new Date(monthStart(3).getTime() + days(2)));
      const name = partitionOf(monthStart(1));
      // A new log is leaves only: its month is sealed once the tree covers it.
      const seal = () => client!.post(`/audit/partitions/${name}/seal`, { token: platform });
      await until('the month to be under a checkpoint', async () => (await seal()).status === 201);
      const exported = await client.get(`/audit/partitions/${name}/export`, { token: platform });
      const file = verifyFile(exported.text);
      expect(file).toMatchObject({
        ok: true,
        checked: 1,
        header: { format: 'toolgate-audit-partition-v4', first_leaf_index: 0, last_leaf_index: 0 },
      });
      const detached = await client.post(`/audit/partitions/${name}/detach`, {
        token: platform,
        body: { last_seq: 1, last_hash: file.header!.last_hash },
      });
      expect(detached.status).toBe(200);
      await until('the detachment to be under a checkpoint', async () => {
        const verified = await client!.get('/audit/verify', { token: platform });
        return verified.body.tree.tree_size >= 4;
      });
      const verified = await client.get('/audit/verify', { token: platform });
      expect(verified.body).toMatchObject({ ok: true, tree: { ok: true } });
      expect(await client.get(`/audit/partitions`, { token: platform })).toMatchObject({
        body: { items: expect.arrayContaining([expect.objectContaining({ name, state: 'detached' })]) },
      });
    } finally {
      await client?.close();
      await database.close();
    }
  });
});

/** Keys sorted at every depth: the file's canonical form. */
function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value === null || typeof value !== 'object') return value;
  return Object.fromEntries(
    Object.keys(value)
      .sort()
      .map((k) => [k, sortKeys((value as Record<string, unknown>)[k])]),
  );
}

describe.skipIf(!hasPostgresServer)('audit partitions when the database goes away (needs a PostgreSQL server)', () => {
  it('answers 503 gateway_unavailable on every partition route', async () => {
    const h = await startHarness({}, { chain: 'open' });
    const server = new URL(h.db.url!);
    const proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    const database = await openDatabase({ databaseUrl: proxy.urlFor(h.db.url!), dataDir: '', poolSize: 2, logger });
    const client = await AppClient.start(database);
    try {
      const name = partitionOf(monthStart(1));
      proxy.cutConnections();
      const answers = [
        await client.get('/audit/partitions', { token: platform }),
        await client.post(`/audit/partitions/${name}/seal`, { token: platform }),
        await client.get(`/audit/partitions/${name}/export`, { token: platform }),
        await client.post(`/audit/partitions/${name}/detach`, {
          token: platform,
          body: { last_seq: 1, last_hash: '0'.repeat(64) },
        }),
      ];
      for (const answer of answers) {
        expect(answer.status).toBe(503);
        expect(answer.body).toMatchObject({ error: { code: 'gateway_unavailable' } });
      }
    } finally {
      await client.close();
      await database.close();
      await proxy.close();
      await h.close();
    }
  });
});

describe('a long range walked in chunks, one snapshot each', () => {
  it('verifies across chunk ends, streams every record once, and still finds an edit in a later chunk', async () => {
    const h = await startHarness({}, { chain: 'open' });
    try {
      const db = h.db.database.control;
      await h.client.app.services.audit.appendMany(
        Array.from({ length: 7 }, (_, i) => ({ event_type: 'partition.test', actor: `system.${i}` })),
      );
      const head = await readChainHead(db);
      const lines: string[] = [];
      const genesis = { seq: 0, hash: '0'.repeat(64) };
      const collect = async (page: string[]) => void lines.push(...page);
      const walked = await walkRange(db, genesis, head, collect, 3, 2);
      expect(walked).toMatchObject({ ok: true, checked: head.seq, through: head.seq });
      expect(lines.map((line) => (JSON.parse(line) as { seq: number }).seq)).toEqual(
        Array.from({ length: head.seq }, (_, i) => i + 1),
      );

      await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
      try {
        await sql`update audit_events set actor = 'operator:mallory' where seq = 6`.execute(db);
      } finally {
        await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
      }
      expect(await walkRange(db, genesis, head, undefined, 3, 2)).toMatchObject({
        ok: false,
        first_bad_seq: 6,
        checked: 5,
      });
    } finally {
      await h.close();
    }
  });
});
