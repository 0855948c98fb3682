/**
 * `npm run bench:audit`: how fast the audit chain verifies, on a fresh database holding
 * BENCH_AUDIT_ROWS rows (default 1,000,000) shaped like a tool call's intent and outcome records.
 *
 * Baseline, measured in the same run: reading every row in key order, in pages of 2,000 rows,
 * without hashing. Then the full walk (`GET /audit/verify`), and a walk from a checkpoint 10,000
 * rows before the head; the sequencer numbering every row into the Merkle tree (records/s), the
 * tree's full verification (leaves/s) and one from a checkpoint 10,000 leaves before the end.
 * Prints rates and the ratio of each to the baseline.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { loadavg } from 'node:os';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { GENESIS_HASH, payloadHash, sealLinked, type UnsealedLink } from '../src/audit/audit-hash.js';
import { appendCarrying, closeAuditChain, insertSealedRecords } from '../src/audit/audit-repository.js';
import { verifyAuditChain } from '../src/audit/chain-verification.js';
import { AuditTree } from '../src/audit/audit-tree.js';
import { logSigner } from '../src/audit/log-key.js';
import { LogSequencer } from '../src/audit/log-sequencer.js';
import { openDatabase } from '../src/db/database.js';
import { migrate } from '../src/db/migrate.js';
import type { DB } from '../src/db/schema.js';
import { createBenchDatabase } from './gateway-process.js';

const serverUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const rows = Number(process.env.BENCH_AUDIT_ROWS ?? 1_000_000);
const PAGE = 2000;
const INSERT_BATCH = 5000;

function recordAt(seq: number, prevHash: string, start: number): UnsealedLink {
  const call = Math.floor(seq / 2);
  const outcome = seq % 2 === 1;
  return {
    seq,
    event_id: randomUUID(),
    occurred_at: new Date(start + seq).toISOString(),
    tenant_id: `tenant-${call % 7}`,
    actor: `agent:agent-${call % 13}`,
    agent_id: `agent-${call % 13}`,
    event_type: outcome ? 'tool.call.completed' : 'tool.call.dispatched',
    run_id: `run_${call}`,
    tool_call_id: `run_${call}:0`,
    tool_id: 'web.fetch',
    tool_version: '1.2.0',
    tool_category: 'read',
    risk_level: 'low',
    trace_id: randomBytes(16).toString('hex'),
    organization_id: null,
    assessment_id: null,
    status: outcome ? 'completed' : 'dispatched',
    reason_code: null,
    input_sha256: payloadHash({ url: `https://example.com/${call}` }),
    output_sha256: outcome ? payloadHash({ status: 200, call }) : null,
    duration_ms: outcome ? 12.5 + (call % 50) : null,
    cost_units: outcome ? 1 : null,
    details: outcome ? { reservation_id: `res_${call}`, via: 'rest', attempt: 1 } : { via: 'rest' },
    prev_hash: prevHash,
  };
}

async function fill(db: Kysely<DB>): Promise<{ seq: number; hash: string }[]> {
  const start = Date.parse('2026-11-01T00:00:00Z');
  let prevHash = GENESIS_HASH;
  const heads: { seq: number; hash: string }[] = [];
  for (let first = 1; first <= rows; first += INSERT_BATCH) {
    const json: string[] = [];
    for (let seq = first; seq < Math.min(first + INSERT_BATCH, rows + 1); seq += 1) {
      const sealed = sealLinked(recordAt(seq, prevHash, start));
      json.push(sealed.json);
      prevHash = sealed.hash;
      heads.push({ seq, hash: sealed.hash });
    }
    await insertSealedRecords(db, json);
  }
  const last = heads[heads.length - 1]!;
  // A log of the chain, as one written before it closed (a new database's is closed at its genesis).
  await sql`update audit_chain_head set seq = ${last.seq}, hash = ${last.hash}, closed = false where id = 1`.execute(
    db,
  );
  await sql`vacuum analyze audit_events`.execute(db);
  return heads;
}

async function readAll(db: Kysely<DB>): Promise<number> {
  let after = 0;
  let count = 0;
  for (;;) {
    const page = await db
      .selectFrom('audit_events')
      .selectAll()
      .where('seq', '>', after)
      .orderBy('seq')
      .limit(PAGE)
      .execute();
    count += page.length;
    if (page.length < PAGE) return count;
    after = Number(page[page.length - 1]!.seq);
  }
}

async function timed<T>(run: () => Promise<T>): Promise<{ value: T; seconds: number }> {
  const began = process.hrtime.bigint();
  const value = await run();
  return { value, seconds: Number(process.hrtime.bigint() - began) / 1e9 };
}

const bench = await createBenchDatabase(serverUrl);
const database = await openDatabase({
  databaseUrl: bench.url,
  dataDir: '',
  poolSize: 4,
  logger: pino({ level: 'silent' }),
});
try {
  await migrate(database.control);
  const filled = await timed(() => fill(database.control));
  console.log(`filled ${rows.toLocaleString()} rows in ${filled.seconds.toFixed(1)} s`);
  const heads = filled.value;

  // The machine's load beside the figures: they move with it, their ratio much less.
  const loadBefore = loadavg()[0]!;
  const read = await timed(() => readAll(database.control));
  const readRate = read.value / read.seconds;
  const full = await timed(() => verifyAuditChain(database.control));
  if (!full.value.ok) throw new Error(`the chain did not verify: ${JSON.stringify(full.value)}`);
  const fullRate = full.value.checked / full.seconds;
  const from = heads[Math.max(heads.length - 10_001, 0)]!;
  const tail = await timed(() => verifyAuditChain(database.control, undefined, undefined, from));
  if (!tail.value.ok) throw new Error(`the tail did not verify: ${JSON.stringify(tail.value)}`);

  // The Merkle tree: the sequencer numbers every row, as it would records arriving at that rate.
  const signer = logSigner({ origin: 'bench.toolgate/audit', signingKeyPem: undefined, dataDir: '' });
  const sequencer = new LogSequencer({
    database,
    signer,
    replicaId: 'bench',
    intervalMs: 200,
    logger: pino({ level: 'silent' }),
  });
  const sequenced = await timed(async () => {
    let total = 0;
    for (let round = await sequencer.round(); round > 0; round = await sequencer.round()) total += round;
    return total;
  });
  if (sequenced.value !== rows) throw new Error(`the sequencer numbered ${sequenced.value} of ${rows} records`);
  const sequenceRate = sequenced.value / sequenced.seconds;
  const tree = new AuditTree(database, signer, 200);
  const treeFull = await timed(() => tree.verify());
  if (!treeFull.value.ok) throw new Error(`the tree did not verify: ${JSON.stringify(treeFull.value)}`);
  const treeRate = treeFull.value.checked / treeFull.seconds;
  // A checkpoint 10,000 leaves before the end: the sequencer publishes one a batch of 10,000.
  const treeTail = await timed(() => tree.verify(Math.max(rows - 10_000, 0)));
  if (!treeTail.value.ok) throw new Error(`the tree's tail did not verify: ${JSON.stringify(treeTail.value)}`);

  // Leaf records (the chain closed): written as the gateway writes them, sequenced from their queue.
  await closeAuditChain(database.control);
  const leafCount = Math.floor(rows / 2);
  for (let done = 0; done < leafCount; done += INSERT_BATCH) {
    const events = Array.from({ length: Math.min(INSERT_BATCH, leafCount - done) }, (_, i) => ({
      event: { event_type: 'bench.leaf', actor: 'system.bench', tenant_id: 'bench', details: { i: done + i } },
      occurredAt: new Date(),
    }));
    await appendCarrying(database.control, events);
  }
  const leavesSequenced = await timed(async () => {
    let total = 0;
    for (let round = await sequencer.round(); round > 0; round = await sequencer.round()) total += round;
    return total;
  });
  if (leavesSequenced.value !== leafCount)
    throw new Error(`the sequencer numbered ${leavesSequenced.value} of ${leafCount} leaf records`);
  const leafRate = leavesSequenced.value / leavesSequenced.seconds;

  const fmt = (n: number) => Math.round(n).toLocaleString();
  console.log(
    `load average (1 min) ${loadBefore.toFixed(2)} before reading, ${loadavg()[0]!.toFixed(2)} after the walks`,
  );
  console.log(`baseline: read every row in key order     ${fmt(readRate)} rows/s (${read.seconds.toFixed(2)} s)`);
  console.log(
    `full verification                          ${fmt(fullRate)} rows/s (${full.seconds.toFixed(2)} s), ${(fullRate / readRate).toFixed(2)}× the baseline`,
  );
  console.log(
    `from a checkpoint ${fmt(tail.value.checked)} rows before the head  ${tail.seconds.toFixed(3)} s (${(tail.seconds / full.seconds).toFixed(4)}× the full walk)`,
  );
  console.log(
    `sequencing into the Merkle tree            ${fmt(sequenceRate)} records/s (${sequenced.seconds.toFixed(2)} s), ${(sequenceRate / readRate).toFixed(2)}× the baseline`,
  );
  console.log(
    `sequencing leaf records from their queue   ${fmt(leafRate)} records/s (${leavesSequenced.seconds.toFixed(2)} s, ${fmt(leafCount)} records), ${(leafRate / readRate).toFixed(2)}× the baseline`,
  );
  console.log(
    `full verification of the tree             ${fmt(treeRate)} leaves/s (${treeFull.seconds.toFixed(2)} s), ${(treeRate / readRate).toFixed(2)}× the baseline`,
  );
  console.log(
    `the tree from a checkpoint ${fmt(treeTail.value.checked)} leaves before the end  ${treeTail.seconds.toFixed(3)} s (${(treeTail.seconds / treeFull.seconds).toFixed(4)}× the full verification)`,
  );
} finally {
  await database.close();
  await bench.drop();
}
