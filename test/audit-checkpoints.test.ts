import { generateKeyPairSync, randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hexOf } from '../src/audit/audit-listing.js';
import { ConfigError } from '../src/config/config.js';
import type { DB } from '../src/db/schema.js';
import { AppClient, startHarness, testConfig, type Harness } from './helpers/harness.js';
import { chainOf } from './helpers/audit.js';
import { tokens } from './helpers/tokens.js';
import { ed25519Pem } from './helpers/signing-keys.js';

const platform = tokens.platform();

const keyA = ed25519Pem();
const keyB = ed25519Pem();

async function appendEvents(h: Harness, count: number, name = 'chain.test'): Promise<void> {
  await h.client.app.services.audit.appendMany(
    Array.from({ length: count }, (_, i) => ({ event_type: name, actor: `system.${i}`, details: { i } })),
  );
}

async function editRow(db: Kysely<DB>, seq: number): Promise<void> {
  await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
  try {
    await sql`update audit_events set actor = 'operator:mallory' where seq = ${seq}`.execute(db);
  } finally {
    await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
  }
}

async function checkpoint(h: Harness) {
  const res = await h.client.post('/audit/checkpoints', { token: platform });
  expect(res.status).toBe(201);
  return res.body as { id: string; seq: number; hash: string; key_id: string | null; signature: string | null };
}

const verifyFrom = (h: { client: AppClient }, id: string) =>
  h.client.get('/audit/verify', { token: platform, query: { from_checkpoint: id } });

describe('audit checkpoints, signed', () => {
  let h: Harness;
  beforeAll(async () => {
    h = await startHarness({ TOOLGATE_AUDIT_SIGNING_KEY: keyA.privatePem }, { chain: 'open' });
  });
  afterAll(() => h.close());

  it('records a signed checkpoint of the verified head, lists it, and audits its making', async () => {
    await appendEvents(h, 5);
    const head = (await h.client.get('/audit/verify', { token: platform })).body.head;
    const made = await checkpoint(h);
    expect(made).toMatchObject({ seq: head.seq, hash: head.hash, created_by: expect.stringContaining('operator:') });
    expect(made.key_id).toMatch(/^[0-9a-f]{16}$/);
    expect(made.signature).toMatch(/^[A-Za-z0-9_-]{86}$/);

    const listed = await h.client.get('/audit/checkpoints', { token: platform });
    expect(listed.body.items[0]).toEqual(made);

    const events = await h.client.get('/audit', { token: platform, query: { event_type: 'audit.checkpoint_created' } });
    expect(events.body.items[0]).toMatchObject({ details: { checkpoint_id: made.id, seq: made.seq } });
  });

  it('verifies only the rows after a checkpoint, and still finds an edit after it', async () => {
    const made = await checkpoint(h);
    await appendEvents(h, 7);
    const fromIt = await verifyFrom(h, made.id);
    // The seven appended, and the checkpoint's own creation record.
    expect(fromIt.body).toMatchObject({ ok: true, checked: 8, first_bad_seq: null, from_checkpoint: { id: made.id } });
    const full = await h.client.get('/audit/verify', { token: platform });
    expect(full.body.checked).toBeGreaterThan(fromIt.body.checked);
    expect(fromIt.body.head).toEqual(full.body.head);

    // An edit before the checkpoint is outside what it reads: the checkpoint vouches for that part.
    await editRow(h.db.database.control, 2);
    expect((await verifyFrom(h, made.id)).body.ok).toBe(true);
    expect((await h.client.get('/audit/verify', { token: platform })).body).toMatchObject({
      ok: false,
      first_bad_seq: 2,
    });

    await editRow(h.db.database.control, made.seq + 3);
    expect(chainOf((await verifyFrom(h, made.id)).body)).toEqual({
      ok: false,
      checked: 2,
      first_bad_seq: made.seq + 3,
      head: null,
      from_checkpoint: { id: made.id, seq: made.seq },
    });
  });

  it('refuses to checkpoint a chain that does not verify from the last checkpoint', async () => {
    const before = (await h.client.get('/audit/checkpoints', { token: platform })).body.items.length;
    const res = await h.client.post('/audit/checkpoints', { token: platform });
    expect(res.status).toBe(409);
    expect(res.body.error).toMatchObject({
      code: 'audit_chain_broken',
      details: { first_bad_seq: expect.any(Number) },
    });
    expect((await h.client.get('/audit/checkpoints', { token: platform })).body.items.length).toBe(before);
  });
});

describe('forged and foreign checkpoints', () => {
  let h: Harness;
  let made: { id: string; seq: number; hash: string; key_id: string | null; signature: string | null };
  beforeAll(async () => {
    h = await startHarness({ TOOLGATE_AUDIT_SIGNING_KEY: keyA.privatePem }, { chain: 'open' });
    await appendEvents(h, 3);
    made = await checkpoint(h);
    await appendEvents(h, 2);
  });
  afterAll(() => h.close());

  async function forge(fields: Record<string, unknown>): Promise<string> {
    const id = `ckpt_${randomUUID()}`;
    await h.db.database.control
      .insertInto('audit_checkpoints')
      .values({
        id,
        seq: made.seq,
        hash: made.hash,
        at: new Date(),
        key_id: made.key_id,
        signature: made.signature,
        created_by: 'operator:mallory',
        ...fields,
      })
      .execute();
    return id;
  }

  it('refuses a checkpoint whose signature does not cover it (a moved seq, another hash)', async () => {
    const rows = await h.db.database.control
      .selectFrom('audit_events')
      .select(['seq', hexOf('hash').as('hash')])
      .orderBy('seq')
      .execute();
    const later = rows[rows.length - 1]!;
    const forged = await forge({ seq: Number(later.seq), hash: later.hash });
    const res = await verifyFrom(h, forged);
    expect(res.status).toBe(422);
    expect(res.body.error).toMatchObject({ code: 'checkpoint_untrusted', details: { reason: 'bad_signature' } });
  });

  it('refuses an unsigned checkpoint while the gateway signs, and one signed by a key it does not know', async () => {
    const unsigned = await forge({ key_id: null, signature: null });
    expect((await verifyFrom(h, unsigned)).body.error).toMatchObject({
      code: 'checkpoint_untrusted',
      details: { reason: 'unsigned' },
    });
    const foreign = await forge({ key_id: 'ffffffffffffffff' });
    expect((await verifyFrom(h, foreign)).body.error.details.reason).toBe('unknown_key');
  });

  it('does not start a new checkpoint from a forged one', async () => {
    // A forged checkpoint at the head would let a broken prefix pass if creation trusted it.
    await editRow(h.db.database.control, made.seq + 1);
    const rows = await h.db.database.control
      .selectFrom('audit_events')
      .select(['seq', hexOf('hash').as('hash')])
      .orderBy('seq')
      .execute();
    const last = rows[rows.length - 1]!;
    await forge({ seq: Number(last.seq), hash: last.hash, key_id: null, signature: null });
    const res = await h.client.post('/audit/checkpoints', { token: platform });
    expect(res.status).toBe(409);
    expect(res.body.error.details).toMatchObject({ first_bad_seq: made.seq + 1, from_checkpoint_id: made.id });
  });

  it('answers 404 for an unknown checkpoint and 400 for a malformed cursor', async () => {
    expect((await verifyFrom(h, 'ckpt_nope')).status).toBe(404);
    expect((await h.client.get('/audit/checkpoints', { token: platform, query: { cursor: 'xyz' } })).status).toBe(400);
  });

  it('is for platform-operators only', async () => {
    const tenantOp = tokens.tenantOperator('tenant-a');
    expect((await h.client.post('/audit/checkpoints', { token: tenantOp })).status).toBe(403);
    expect((await h.client.get('/audit/checkpoints', { token: tenantOp })).status).toBe(403);
  });
});

describe('key rotation and unsigned checkpoints', () => {
  it('trusts an earlier key only when it is listed among the verify keys', async () => {
    const h = await startHarness({ TOOLGATE_AUDIT_SIGNING_KEY: keyA.privatePem }, { chain: 'open' });
    try {
      await appendEvents(h, 2);
      const made = await checkpoint(h);
      const rotated = await AppClient.start(h.db.database, { TOOLGATE_AUDIT_SIGNING_KEY: keyB.privatePem });
      const trusting = await AppClient.start(h.db.database, {
        TOOLGATE_AUDIT_SIGNING_KEY: keyB.privatePem,
        TOOLGATE_AUDIT_VERIFY_KEYS: keyA.publicPem,
      });
      try {
        expect((await verifyFrom({ client: rotated }, made.id)).body.error.details.reason).toBe('unknown_key');
        expect((await verifyFrom({ client: trusting }, made.id)).body).toMatchObject({ ok: true, checked: 1 });
      } finally {
        await Promise.all([rotated.close(), trusting.close()]);
      }
    } finally {
      await h.close();
    }
  });

  it('records unsigned checkpoints without a key, and verifies from them', async () => {
    const h = await startHarness({}, { chain: 'open' });
    try {
      await appendEvents(h, 4);
      const made = await checkpoint(h);
      expect(made).toMatchObject({ key_id: null, signature: null, seq: 4 });
      await appendEvents(h, 3);
      expect((await verifyFrom(h, made.id)).body).toMatchObject({ ok: true, checked: 4 });
    } finally {
      await h.close();
    }
  });

  it('checkpoints the head periodically only when it moved, once across replicas', async () => {
    const h = await startHarness({}, { chain: 'open' });
    try {
      const checkpoints = h.client.app.services.auditCheckpoints;
      await appendEvents(h, 3);
      const [first, second] = await Promise.all([
        checkpoints.create('system.audit-checkpoint', { onlyIfMoved: true }),
        checkpoints.create('system.audit-checkpoint', { onlyIfMoved: true }),
      ]);
      expect([first, second].filter((made) => made !== null)).toHaveLength(1);
      expect(await checkpoints.create('system.audit-checkpoint', { onlyIfMoved: true })).toBeNull();
      await appendEvents(h, 1);
      expect(await checkpoints.create('system.audit-checkpoint', { onlyIfMoved: true })).toMatchObject({ seq: 4 });
    } finally {
      await h.close();
    }
  });
});

describe('checkpoint configuration', () => {
  it('refuses a key that is not Ed25519, and an interval out of range', () => {
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ type: 'pkcs8', format: 'pem' });
    expect(() => testConfig({ TOOLGATE_AUDIT_SIGNING_KEY: rsa.toString() })).toThrow(ConfigError);
    expect(() => testConfig({ TOOLGATE_AUDIT_SIGNING_KEY: 'not a key' })).toThrow(/TOOLGATE_AUDIT_SIGNING_KEY/);
    expect(() => testConfig({ TOOLGATE_AUDIT_VERIFY_KEYS: keyA.privatePem })).toThrow(/TOOLGATE_AUDIT_VERIFY_KEYS/);
    expect(() => testConfig({ TOOLGATE_AUDIT_CHECKPOINT_INTERVAL_SECONDS: '5' })).toThrow(ConfigError);
    expect(testConfig({ TOOLGATE_AUDIT_CHECKPOINT_INTERVAL_SECONDS: '0' }).auditCheckpoints.intervalSeconds).toBe(0);
    // A key given on one line, with \n escapes, as some secret stores hand it over.
    const oneLine = keyA.privatePem.replace(/\n/g, '\\n');
    expect(testConfig({ TOOLGATE_AUDIT_SIGNING_KEY: oneLine }).auditCheckpoints.signingKey).toBe(keyA.privatePem);
  });
});
