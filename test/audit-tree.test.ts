import { createHash, createPublicKey, verify as verifySignature } from 'node:crypto';
import canonicalizeJcs from 'canonicalize';
import { sql } from 'kysely';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readLeafRecords } from '../src/audit/hashed-rows.js';
import { openDatabase, type Database } from '../src/db/database.js';
import { withTriggerOff } from './helpers/audit.js';
import { TestBackend } from './helpers/backend.js';
import { hasPostgresServer } from './helpers/database.js';
import { AppClient, startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { ed25519Pem } from './helpers/signing-keys.js';
import { TcpProxy } from './helpers/tcp-proxy.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

/*
 * A verifier written apart from the gateway's code, from RFC 9162, C2SP signed-note and RFC 8785 alone
 * (with the `canonicalize` package, by RFC 8785's author): what a witness or an auditor would run.
 */
// A CommonJS module whose types describe an ES default export.
const canonicalize = canonicalizeJcs as unknown as (input: unknown) => string | undefined;
const sha256 = (...parts: Buffer[]) => createHash('sha256').update(Buffer.concat(parts)).digest();
const independent = {
  leaf: (record: unknown) => sha256(Buffer.from([0]), Buffer.from(canonicalize(record)!, 'utf8')),
  node: (l: Buffer, r: Buffer) => sha256(Buffer.from([1]), l, r),
  /** RFC 9162 §2.1.3.2, written as a walk up the tree by bits of the index. */
  inclusionRoot(index: number, size: number, leaf: Buffer, proof: Buffer[]): Buffer | null {
    if (index >= size) return null;
    let hash = leaf;
    let i = 0;
    let node = index;
    let last = size - 1;
    while (last > 0) {
      if (node % 2 === 1) {
        if (i >= proof.length) return null;
        hash = independent.node(proof[i++]!, hash);
      } else if (node < last) {
        if (i >= proof.length) return null;
        hash = independent.node(hash, proof[i++]!);
      }
      node = Math.floor(node / 2);
      last = Math.floor(last / 2);
    }
    return i === proof.length ? hash : null;
  },
  /** RFC 9162 §2.1.4.2. */
  consistent(m: number, n: number, mRoot: Buffer, nRoot: Buffer, proof: Buffer[]): boolean {
    if (m === n) return proof.length === 0 && mRoot.equals(nRoot);
    if (m === 0 || proof.length === 0) return false;
    const path = (m & (m - 1)) === 0 ? [mRoot, ...proof] : [...proof];
    let fn = m - 1;
    let sn = n - 1;
    while (fn & 1) {
      fn >>= 1;
      sn >>= 1;
    }
    let fr = path[0]!;
    let sr = path[0]!;
    for (const c of path.slice(1)) {
      if (sn === 0) return false;
      if (fn & 1 || fn === sn) {
        fr = independent.node(c, fr);
        sr = independent.node(c, sr);
        if (!(fn & 1))
          while (!(fn & 1) && fn !== 0) {
            fn >>= 1;
            sn >>= 1;
          }
      } else sr = independent.node(sr, c);
      fn >>= 1;
      sn >>= 1;
    }
    return sn === 0 && fr.equals(mRoot) && sr.equals(nRoot);
  },
  /** C2SP signed-note with an Ed25519 verifier key, then C2SP tlog-checkpoint. */
  openCheckpoint(note: string, verifierKey: string): { origin: string; size: number; root: Buffer } | null {
    const [name, keyHash, ...rest] = verifierKey.split('+');
    const key = Buffer.from(rest.join('+'), 'base64');
    const id = sha256(Buffer.from(`${name}\n`), key).subarray(0, 4);
    if (key[0] !== 1 || id.toString('hex') !== keyHash) return null;
    const publicKey = createPublicKey({
      key: { kty: 'OKP', crv: 'Ed25519', x: key.subarray(1).toString('base64url') },
      format: 'jwk',
    });
    const [text, signatures] = [note.slice(0, note.indexOf('\n\n') + 1), note.slice(note.indexOf('\n\n') + 2)];
    const ok = signatures
      .split('\n')
      .filter((line) => line.startsWith(`\u2014 ${name} `))
      .some((line) => {
        const blob = Buffer.from(line.split(' ')[2]!, 'base64');
        return blob.subarray(0, 4).equals(id) && verifySignature(null, Buffer.from(text), publicKey, blob.subarray(4));
      });
    if (!ok) return null;
    const [origin, size, root] = text.split('\n');
    return { origin: origin!, size: Number(size), root: Buffer.from(root!, 'base64') };
  },
};

const T = 'tenant-tree';
const AGENT = 'tree.agent';
const agent = tokens.agent(AGENT, { tenant: T });
const otherAgent = tokens.agent('tree.other', { tenant: T });
const operator = tokens.tenantOperator(T);
const stranger = tokens.tenantOperator('tenant-elsewhere');
const platform = tokens.platform();
const key = ed25519Pem();
const b64 = (values: string[]) => values.map((v) => Buffer.from(v, 'base64'));

let h: Harness;
let backend: TestBackend;
let info: { origin: string; verifier_key: string; sequence_interval_ms: number };

async function latestCheckpoint(client: AppClient = h.client) {
  const res = await client.get('/audit/checkpoint', { token: agent });
  expect(res.status).toBe(200);
  expect(res.headers['content-type']).toBe('text/plain; charset=utf-8');
  const head = independent.openCheckpoint(res.text, info.verifier_key);
  expect(head, res.text).not.toBeNull();
  return { note: res.text, ...head! };
}

/** Resolves once every record of the run is in a published checkpoint. */
async function sequencedReceipt(runId: string, token = agent) {
  let receipt: any;
  await until('the run to be sequenced', async () => {
    const res = await h.client.get(`/runs/${runId}/receipt`, { token });
    receipt = res.body;
    return res.status === 200 && receipt.pending.length === 0;
  });
  return receipt;
}

beforeAll(async () => {
  h = await startHarness({
    TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem,
    TOOLGATE_AUDIT_LOG_ORIGIN: 'toolgate.test/audit',
    TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '50',
  });
  backend = await new TestBackend().start();
  await registerTool(h.client, { id: 'tree.echo', backendUrl: `${backend.url}/echo`, allowed_agents: [AGENT] });
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: 'tree.echo' });
  info = (await h.client.get('/audit/log-info', { token: agent })).body;
});
afterAll(async () => {
  await h?.close();
  await backend?.close();
});

describe('the verifiable audit log (SPEC §8.1)', () => {
  it('names its origin and Ed25519 note verifier key', () => {
    expect(info).toEqual({
      origin: 'toolgate.test/audit',
      verifier_key: expect.stringMatching(/^toolgate\.test\/audit\+[0-9a-f]{8}\+A[A-Za-z0-9+/]{43}$/),
      sequence_interval_ms: 50,
    });
  });

  it("gives each of a call's records a leaf, and an inclusion proof an independent verifier accepts", async () => {
    const runId = newRunId('tree');
    const ran = await execute(h.client, agent, { run_id: runId, context: {}, plan: [step('tree.echo', 'one')] });
    expect(ran.status, JSON.stringify(ran.body)).toBe(200);
    const receipt = await sequencedReceipt(runId);
    const head = independent.openCheckpoint(receipt.checkpoint, info.verifier_key)!;
    expect(head).toMatchObject({ origin: 'toolgate.test/audit', size: receipt.tree_size });
    const types = receipt.records.map((r: any) => r.record.event_type);
    // The call's intent before the backend was contacted, and its outcome.
    expect(types).toEqual(expect.arrayContaining(['run.step.dispatching', 'run.step.completed']));
    for (const entry of receipt.records) {
      const leaf = independent.leaf(entry.record);
      expect(leaf.toString('base64')).toBe(entry.leaf_hash);
      const root = independent.inclusionRoot(entry.leaf_index, head.size, leaf, b64(entry.proof));
      expect(root?.equals(head.root)).toBe(true);
    }

    const [first] = receipt.records;
    const event = await h.client.get(`/audit/events/${first.record.event_id}`, { token: operator });
    expect(event.body).toEqual({
      record: first.record,
      seq: expect.any(Number),
      leaf_index: first.leaf_index,
      leaf_hash: first.leaf_hash,
    });
    const latest = await latestCheckpoint();
    const inclusion = await h.client.get(`/audit/events/${first.record.event_id}/inclusion`, { token: agent });
    expect(inclusion.body).toMatchObject({ leaf_index: first.leaf_index, leaf_hash: first.leaf_hash });
    const proven = independent.inclusionRoot(
      inclusion.body.leaf_index,
      inclusion.body.tree_size,
      Buffer.from(inclusion.body.leaf_hash, 'base64'),
      b64(inclusion.body.proof),
    );
    const against = independent.openCheckpoint(
      (
        await h.client.get('/audit/checkpoint', {
          token: agent,
          query: { tree_size: String(inclusion.body.tree_size) },
        })
      ).text,
      info.verifier_key,
    );
    expect(inclusion.body.tree_size).toBeGreaterThanOrEqual(head.size);
    expect(inclusion.body.tree_size).toBeLessThanOrEqual(latest.size);
    expect(proven?.equals(against!.root)).toBe(true);
  });

  it('proves that the log only grew, between any two checkpoints', async () => {
    const before = await latestCheckpoint();
    await h.client.app.services.audit.appendMany(
      Array.from({ length: 300 }, (_, i) => ({ event_type: 'tree.test', actor: 'system.test', details: { i } })),
    );
    await until('the appends to be sequenced', async () => (await latestCheckpoint()).size >= before.size + 300);
    const after = await latestCheckpoint();
    const res = await h.client.get('/audit/consistency', {
      token: agent,
      query: { first: String(before.size), second: String(after.size) },
    });
    expect(res.status).toBe(200);
    expect(independent.consistent(before.size, after.size, before.root, after.root, b64(res.body.proof))).toBe(true);
    expect(independent.consistent(before.size, after.size, after.root, after.root, b64(res.body.proof))).toBe(false);
    const bad = await h.client.get('/audit/consistency', { token: agent, query: { first: '5', second: '2' } });
    expect(bad.status).toBe(400);
    const beyond = await h.client.get('/audit/consistency', {
      token: agent,
      query: { first: '1', second: String(after.size + 1_000_000) },
    });
    expect(beyond.status).toBe(404);
  });

  it("keeps records and receipts within their tenant and their run's agent", async () => {
    const runId = newRunId('tenancy');
    await execute(h.client, agent, { run_id: runId, context: {}, plan: [step('tree.echo', 'two')] });
    const receipt = await sequencedReceipt(runId);
    const id = receipt.records[0].record.event_id;
    expect((await h.client.get(`/audit/events/${id}`, { token: stranger })).status).toBe(404);
    expect((await h.client.get(`/audit/events/${id}/inclusion`, { token: stranger })).status).toBe(404);
    expect((await h.client.get(`/audit/events/${id}`, { token: platform })).status).toBe(200);
    expect((await h.client.get(`/runs/${runId}/receipt`, { token: otherAgent })).status).toBe(404);
    expect((await h.client.get(`/runs/${runId}/receipt`, { token: operator })).status).toBe(200);
    expect((await h.client.get(`/runs/${runId}/receipt`, { token: stranger })).status).toBe(404);
    expect((await h.client.get('/audit/events/not-a-uuid', { token: platform })).status).toBe(400);
    expect((await h.client.get(`/audit/checkpoint`, { token: agent, query: { tree_size: '01' } })).status).toBe(400);
  });

  it('reads only the records asked for, even those lying close together (a receipt holds its run alone)', async () => {
    const [a, , c] = await h.client.app.services.audit.appendMany(
      ['t-a', 't-b', 't-c'].map((tenant) => ({ event_type: 'tree.test', actor: 'system.test', tenant_id: tenant })),
    );
    const read = await h.db.database.control
      .transaction()
      .execute((trx) => readLeafRecords(trx, { seqs: [a!.seq, c!.seq] }));
    expect(read.map((r) => r.eventId)).toEqual([a!.event_id, c!.event_id]);
  });

  it('verifies every leaf against the stored records, and finds the first one edited', async () => {
    const full = await h.client.get('/audit/verify', { token: platform });
    expect(full.status).toBe(200);
    expect(full.body).toMatchObject({ ok: true, tree: { ok: true, first_bad_leaf_index: null } });
    const size = full.body.tree.tree_size as number;
    expect(full.body.tree.checked).toBe(size);
    const fromRecent = await h.client.get('/audit/verify', {
      token: platform,
      query: { from_tree_size: String(size) },
    });
    expect(fromRecent.body).toMatchObject({ ok: true, tree: { checked: expect.any(Number), from_tree_size: size } });
    expect(fromRecent.body.tree.checked).toBe(fromRecent.body.tree.tree_size - size);

    const db = h.db.database.control;
    const leaf = await db
      .selectFrom('audit_leaves')
      .select(['leaf_index', 'seq'])
      .where('leaf_index', '=', '3' as never)
      .executeTakeFirstOrThrow();
    await withTriggerOff(db, () =>
      sql`update audit_events set actor = 'operator:mallory' where seq = ${leaf.seq}`.execute(db),
    );
    const tampered = await h.client.get('/audit/verify', { token: platform });
    expect(tampered.body.ok).toBe(false);
    expect(tampered.body.tree).toMatchObject({
      ok: false,
      first_bad_leaf_index: 3,
      reason: 'record_changed',
      checked: 3,
    });
    // A checkpoint after the edit vouches only for what came after it.
    const later = await h.client.get('/audit/verify', { token: platform, query: { from_tree_size: String(size) } });
    expect(later.body.ok).toBe(true);
  });
});

describe.skipIf(!hasPostgresServer)('sequencing across a database outage (needs a PostgreSQL server)', () => {
  let proxy: TcpProxy;
  let database: Database;
  let client: AppClient;

  beforeAll(async () => {
    const server = new URL(h.db.url!);
    proxy = await new TcpProxy(server.hostname, Number(server.port || 5432)).start();
    database = await openDatabase({
      databaseUrl: proxy.urlFor(h.db.url!),
      dataDir: '',
      poolSize: 5,
      logger: pino({ level: 'silent' }),
    });
    client = await AppClient.start(database, {
      TOOLGATE_AUDIT_SIGNING_KEY: key.privatePem,
      TOOLGATE_AUDIT_LOG_ORIGIN: 'toolgate.test/audit',
      TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '1000',
    });
  });
  afterAll(async () => {
    await client?.close();
    await database?.close();
    await proxy?.close();
  });

  const leafOf = async (eventId: string) =>
    h.db.database.control
      .selectFrom('audit_leaves')
      .select('leaf_index')
      .where('event_id', '=', eventId)
      .executeTakeFirst();

  it('sequences a record committed just before the database went away once it returns', async () => {
    // The first harness's sequencer would sequence it through its own connection: it stands down.
    await h.client.app.services.auditSequencer.stop();
    const before = Number(
      (await h.db.database.control.selectFrom('audit_tree_state').select('tree_size').executeTakeFirstOrThrow())
        .tree_size,
    );
    let eventId: string | undefined;
    for (let attempt = 0; attempt < 5 && eventId === undefined; attempt += 1) {
      const record = await client.app.services.audit.append({ event_type: 'tree.outage', actor: 'system.test' });
      proxy.cutConnections();
      if ((await leafOf(record.event_id)) === undefined) eventId = record.event_id;
      else proxy.restore();
    }
    expect(eventId).toBeDefined();
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    expect(await leafOf(eventId!)).toBeUndefined();
    proxy.restore();
    await until('the record to be sequenced', async () => (await leafOf(eventId!)) !== undefined, {
      timeoutMs: 20_000,
    });
    await until(
      'a checkpoint to cover it',
      async () => (await client.get(`/audit/events/${eventId}/inclusion`, { token: platform })).status === 200,
    );
    const verified = await client.get('/audit/verify', { token: platform, query: { from_tree_size: String(before) } });
    expect(verified.body.tree).toMatchObject({ ok: true, from_tree_size: before });
    expect(verified.body.tree.checked).toBeGreaterThan(0);
  }, 60_000);
});
