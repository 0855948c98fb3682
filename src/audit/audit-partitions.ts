import { randomUUID } from 'node:crypto';
import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import type { AuditTree } from './audit-tree.js';
import { BackgroundTask } from '../db/background-task.js';
import type { Database } from '../db/database.js';
import { CodedError } from '../errors/coded-error.js';
import { GENESIS_HASH } from './audit-hash.js';
import { writeAuditEvents, type ChainHead } from './audit-repository.js';
import { detachReportsBetween, walkRange } from './chain-verification.js';
import { checkpointsAt, checkpointsNewestFirst, insertCheckpoint } from './checkpoint-repository.js';
import { recordCheckpointCreated } from './audit-checkpoints.js';
import { LeafPartitions } from './leaf-partitions.js';
import { readChainEnd } from './tree-repository.js';
import type { Checkpoint, CheckpointSigner } from './checkpoint-signer.js';
import { PARTITION_FILE_FORMAT, exportStream, fileLine, type PartitionFileHeader } from './partition-file.js';
import {
  addMonthPartition,
  detachPartition,
  findLink,
  insertArchive,
  listArchives,
  listPartitionRows,
  type PartitionRow,
} from './partition-repository.js';

/** How many months ahead of this one each have a partition before they begin. */
const MONTHS_AHEAD = 3;
const MAINTENANCE_INTERVAL_MS = 6 * 60 * 60 * 1000;
/** A month is over for sealing this long after it ends: appends carry the time they were made, a little earlier. */
const SEAL_GRACE_MS = 60 * 60 * 1000;
/** How long a detach waits for the log's lock before giving up, rather than stall appends behind it. */
const DETACH_LOCK_TIMEOUT = '5s';

/**
 * Where a partition stands: `open` (its month is not over), `empty`, `unsealed` (over, with no
 * trusted checkpoint at its last seq yet), `sealed` (exportable and detachable), `detached`, and
 * `default` (rows of months with no partition; never sealed).
 */
export type PartitionState = 'open' | 'empty' | 'unsealed' | 'sealed' | 'detached' | 'default';

export interface AuditPartition {
  name: string;
  state: PartitionState;
  range_start: string | null;
  range_end: string | null;
  first_seq: number | null;
  last_seq: number | null;
  /** Exact once detached; otherwise the planner's estimate. */
  rows: number;
  /** The trusted checkpoint at its last seq, once sealed. */
  checkpoint_id: string | null;
  /** Who detached it and when, once detached. */
  detached: { by: string; at: string; event_seq: number } | null;
}

export interface AuditPartitionsOptions {
  database: Database;
  signer: CheckpointSigner;
  /** The log's tree, whose evidence an export carries. */
  tree?: AuditTree;
  now: () => Date;
  logger: Logger;
}

/** The export of a sealed partition, streamed as JSON Lines. */
export interface PartitionExport {
  filename: string;
  stream: Readable;
}

/**
 * The log's monthly partitions: kept ahead of time, sealed with a checkpoint at their last record,
 * exported as a file that verifies offline, and detached by an operator who archived that file.
 * Nothing here deletes: a detached partition stays a table of its own until an operator drops it.
 */
export class AuditPartitions {
  private readonly task: BackgroundTask;
  /** The months of leaf records, archived as ranges of the tree (absent without a tree: none are sealed). */
  private readonly leaves: LeafPartitions | undefined;

  constructor(private readonly options: AuditPartitionsOptions) {
    const { tree } = options;
    this.leaves = tree === undefined ? undefined : new LeafPartitions({ ...options, tree });
    let rounds = 0;
    this.task = new BackgroundTask({
      name: 'audit partition maintenance',
      run: () => this.addMonthsAhead(),
      // The first round soon after start: a gateway restarted often would otherwise never run one.
      intervalMs: (failing) => (rounds++ === 0 ? 1000 : failing ? 60_000 : MAINTENANCE_INTERVAL_MS),
      logger: options.logger,
    });
  }

  start(): void {
    this.task.start();
  }

  async stop(): Promise<void> {
    await this.task.stop();
  }

  /** Gives this month and the next few a partition each, where none holds them yet. */
  async addMonthsAhead(): Promise<void> {
    const now = this.options.now();
    for (let m = 0; m <= MONTHS_AHEAD; m += 1) {
      const month = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + m, 1));
      const result = await addMonthPartition(this.options.database.control, month);
      if (result === 'default_has_rows') {
        this.options.logger.warn(
          { month: month.toISOString().slice(0, 7) },
          'audit partition maintenance: the default partition holds rows of this month, which gets no partition of its own',
        );
      }
    }
  }

  /** Every partition, attached or detached, oldest first. */
  async list(): Promise<AuditPartition[]> {
    const db = this.options.database.control;
    const [rows, archives, chain] = await Promise.all([listPartitionRows(db), listArchives(db), readChainEnd(db)]);
    const attached = await Promise.all(rows.map((row) => this.describe(row, chain)));
    const detached: AuditPartition[] = archives.map((a) => ({
      name: a.partition,
      state: 'detached',
      range_start: null,
      range_end: null,
      first_seq: Number(a.from_seq),
      last_seq: Number(a.to_seq),
      rows: Number(a.row_count),
      checkpoint_id: a.checkpoint_id,
      detached: { by: a.detached_by, at: new Date(a.detached_at).toISOString(), event_seq: Number(a.event_seq) },
    }));
    return [...detached, ...attached].sort((a, b) => (a.first_seq ?? Infinity) - (b.first_seq ?? Infinity));
  }

  /**
   * Records a checkpoint at the partition's last record, signed like any other, once the chain
   * verifies from the newest trusted checkpoint at or below it up to it. Answers the one already
   * there when the partition is sealed (`created` false).
   */
  async seal(name: string, actor: string): Promise<{ checkpoint: Checkpoint; created: boolean }> {
    const closed = await this.closed(name);
    if (closed.kind === 'leaves') {
      const existing = await closed.leaves.sealOf(closed.range);
      if (existing !== undefined) return { checkpoint: existing, created: false };
      return { checkpoint: await closed.leaves.seal(name, closed.range, actor), created: true };
    }
    const { partition, last } = closed;
    const existing = await this.sealOf(partition);
    if (existing !== undefined) return { checkpoint: existing, created: false };
    const db = this.options.database.control;
    let base: ChainHead = { seq: 0, hash: GENESIS_HASH };
    for await (const checkpoint of checkpointsNewestFirst(db, last.seq)) {
      if (this.options.signer.distrust(checkpoint) === null) {
        base = { seq: checkpoint.seq, hash: checkpoint.hash };
        break;
      }
    }
    const walked = await walkRange(db, base, last);
    if (!walked.ok) {
      throw new CodedError('audit_chain_broken', `the audit chain does not verify up to ${name}'s last record`, {
        first_bad_seq: walked.first_bad_seq,
      });
    }
    const checkpoint = this.options.signer.sign({
      id: `ckpt_${randomUUID()}`,
      seq: last.seq,
      hash: last.hash,
      at: this.options.now().toISOString(),
      created_by: actor,
    });
    await db.transaction().execute(async (trx) => {
      await insertCheckpoint(trx, checkpoint);
      await recordCheckpointCreated(trx, checkpoint, actor, this.options.now(), { partition: name });
    });
    return { checkpoint, created: true };
  }

  /**
   * A sealed partition as JSON Lines: a header, its records as they were hashed, and a trailer
   * with the sealing checkpoint. The records are verified as they are read; a break ends the
   * stream with an error, so a file without its trailer was cut short.
   */
  async export(name: string): Promise<PartitionExport> {
    const sealed = await this.sealed(name);
    if (sealed.kind === 'leaves') {
      const stream = sealed.leaves.export(sealed.row, sealed.range, sealed.partition.checkpoint);
      return { filename: `${name}.jsonl`, stream };
    }
    const { partition, last, first } = sealed;
    const { checkpoint } = partition;
    const header: PartitionFileHeader = {
      type: 'header',
      format: PARTITION_FILE_FORMAT,
      partition: name,
      range_start: partition.range_start,
      range_end: partition.range_end,
      first_seq: first.seq,
      last_seq: last.seq,
      prev_hash: first.prev_hash,
      first_hash: first.hash,
      last_hash: last.hash,
      rows: last.seq - first.seq + 1,
      exported_at: this.options.now().toISOString(),
    };
    const evidence = await this.options.tree?.rangeEvidence(first.seq, last.seq);
    if (evidence !== undefined) header.tree = evidence;
    const stream = exportStream(
      async (write) => {
        await write([fileLine(header)]);
        const walked = await walkRange(
          this.options.database.control,
          { seq: first.seq - 1, hash: first.prev_hash },
          last,
          write,
        );
        if (!walked.ok) throw new Error(`the audit chain does not verify at seq ${walked.first_bad_seq}`);
        return checkpoint;
      },
      (error) => this.options.logger.warn({ err: error, partition: name }, 'audit partition export failed'),
    );
    return { filename: `${name}.jsonl`, stream };
  }

  /**
   * Detaches a sealed partition whose last record the operator names as exported (`confirm`), and
   * records the range as archived, with an `audit.partition_detached` record, in one transaction.
   * The table stays in the database, detached, for the operator to drop once the file is safe.
   */
  async detach(name: string, actor: string, confirm: ChainHead): Promise<AuditPartition> {
    const sealed = await this.sealed(name);
    if (sealed.kind === 'leaves') {
      const { checkpoint } = sealed.partition;
      const done = await busyIfLocked(name, () =>
        sealed.leaves.detach(sealed.row, sealed.range, checkpoint, actor, confirm, DETACH_LOCK_TIMEOUT),
      );
      return {
        name,
        state: 'detached',
        range_start: null,
        range_end: null,
        first_seq: done.first_seq,
        last_seq: done.last_seq,
        checkpoint_id: checkpoint.id,
        rows: done.rows,
        detached: { by: actor, at: done.at.toISOString(), event_seq: done.eventSeq },
      };
    }
    const { partition, last, first } = sealed;
    if (confirm.seq !== last.seq || confirm.hash !== last.hash) {
      throw new CodedError('partition_not_sealed', `${name} does not end at the record named as exported`, {
        partition: name,
        reason: 'mismatch',
        last_seq: last.seq,
        last_hash: last.hash,
      });
    }
    const db = this.options.database.control;
    const walked = await walkRange(db, { seq: first.seq - 1, hash: first.prev_hash }, last);
    const before = first.seq === 1 ? GENESIS_HASH : await this.hashAt(first.seq - 1);
    if (!walked.ok || before !== first.prev_hash) {
      throw new CodedError('audit_chain_broken', `${name} does not verify; it stays attached`, {
        first_bad_seq: walked.ok ? first.seq : walked.first_bad_seq,
      });
    }
    const details = {
      partition: name,
      from_seq: first.seq,
      to_seq: last.seq,
      prev_hash: first.prev_hash,
      first_hash: first.hash,
      last_hash: last.hash,
      rows: last.seq - first.seq + 1,
      checkpoint_id: partition.checkpoint.id,
      // Earlier detachments reported inside this range: verification finds their reports here once it is gone.
      archived_records: await detachReportsBetween(db, first.seq, last.seq),
    };
    const at = this.options.now();
    const eventSeq = await busyIfLocked(name, () =>
      db.transaction().execute(async (trx) => {
        await detachPartition(trx, name, DETACH_LOCK_TIMEOUT);
        const [record] = await writeAuditEvents(trx, [
          { event: { event_type: 'audit.partition_detached', actor, details }, occurredAt: at },
        ]);
        await insertArchive(trx, {
          event_seq: record!.seq,
          partition: name,
          from_seq: first.seq,
          to_seq: last.seq,
          prev_hash: first.prev_hash,
          first_hash: first.hash,
          last_hash: last.hash,
          row_count: details.rows,
          checkpoint_id: partition.checkpoint.id,
          detached_by: actor,
          detached_at: at,
        });
        return record!.seq;
      }),
    );
    // As the listing shows it from then on: the range it archived.
    return {
      name,
      state: 'detached',
      range_start: null,
      range_end: null,
      first_seq: first.seq,
      last_seq: last.seq,
      checkpoint_id: partition.checkpoint.id,
      rows: details.rows,
      detached: { by: actor, at: at.toISOString(), event_seq: eventSeq },
    };
  }

  private async hashAt(seq: number): Promise<string | undefined> {
    const link = await findLink(this.options.database.control, seq);
    if (link !== undefined) return link.hash;
    const archives = await listArchives(this.options.database.control);
    return archives.find((a) => Number(a.to_seq) === seq)?.last_hash;
  }

  private async describe(row: PartitionRow, chain: ChainEnd): Promise<AuditPartition> {
    const base = {
      name: row.name,
      range_start: row.range_start?.toISOString() ?? null,
      range_end: row.range_end?.toISOString() ?? null,
      first_seq: row.first_seq,
      last_seq: row.last_seq,
      rows: row.rows_estimate,
      checkpoint_id: null,
      detached: null,
    };
    if (row.is_default) return { ...base, state: 'default' };
    if (!this.isOver(row)) return { ...base, state: 'open' };
    if (row.last_seq === null) return { ...base, state: 'empty' };
    if (this.leaves !== undefined && holdsLeaves(row, chain)) {
      const range = await this.leaves.range(row, chain.seq);
      if (range === 'empty') return { ...base, state: 'empty' };
      const sealed = range === 'unsequenced' ? undefined : await this.leaves.sealOf(range);
      return sealed === undefined
        ? { ...base, state: 'unsealed' }
        : { ...base, state: 'sealed', checkpoint_id: sealed.id };
    }
    const seal = await this.sealOf(row);
    return seal === undefined ? { ...base, state: 'unsealed' } : { ...base, state: 'sealed', checkpoint_id: seal.id };
  }

  private isOver(row: PartitionRow): boolean {
    return row.range_end !== null && row.range_end.getTime() + SEAL_GRACE_MS <= this.options.now().getTime();
  }

  /** A trusted checkpoint at the partition's last record, holding that record's hash. */
  private async sealOf(row: PartitionRow): Promise<Checkpoint | undefined> {
    if (row.last_seq === null) return undefined;
    const db = this.options.database.control;
    const [link, checkpoints] = await Promise.all([findLink(db, row.last_seq), checkpointsAt(db, row.last_seq)]);
    return checkpoints.find((c) => c.hash === link?.hash && this.options.signer.distrust(c) === null);
  }

  /**
   * An attached, finished month, the oldest holding records, and the range of the chain it archives
   * (after the last archived range to its own last record): docs/design/audit-chain.md#partitions.
   */
  private async closed(name: string) {
    const db = this.options.database.control;
    const rows = await listPartitionRows(db);
    const row = rows.find((p) => p.name === name);
    const refuse = (reason: string, message: string): never => {
      throw new CodedError('partition_not_sealed', message, { partition: name, reason });
    };
    const archives = await listArchives(db);
    if (row === undefined) {
      if (archives.some((a) => a.partition === name)) refuse('detached', `${name} is already detached`);
      throw new CodedError('not_found', `no audit partition ${name}`);
    }
    if (row.is_default) refuse('default', 'the default partition holds months without their own; it is never sealed');
    if (!this.isOver(row)) refuse('open', `${name}'s month is not over (an hour after its end)`);
    const start = (p: PartitionRow) => p.range_start?.getTime() ?? -Infinity;
    const chain = await readChainEnd(db);
    for (const older of rows.filter((p) => !p.is_default && p.first_seq !== null && start(p) < start(row))) {
      // A month of leaves whose records all sit in ranges archived before (exported in their files) holds nothing back.
      const archived =
        this.leaves !== undefined &&
        holdsLeaves(older, chain) &&
        (await this.leaves.range(older, chain.seq)) === 'empty';
      if (!archived) refuse('not_oldest', `${older.name} holds older records: archive it first`);
    }
    if (this.leaves !== undefined && holdsLeaves(row, chain)) {
      const range = await this.leaves.range(row, chain.seq);
      if (range === 'empty') return refuse('empty', `${name} holds no records past the archived ranges`);
      if (range === 'unsequenced')
        return refuse('unsequenced', `${name} holds records the tree does not cover yet: seal it once it does`);
      return { kind: 'leaves' as const, row, range, leaves: this.leaves };
    }
    const chainArchives = archives.filter((a) => a.to_leaf === null);
    const from = chainArchives.reduce((max, a) => Math.max(max, Number(a.to_seq)), 0) + 1;
    if (row.last_seq === null || row.last_seq < from)
      return refuse('empty', `${name} holds no records past the archived ranges`);
    const [first, last] = await Promise.all([findLink(db, from), findLink(db, row.last_seq)]);
    if (first === undefined || last === undefined) {
      throw new CodedError('audit_chain_broken', `the audit chain misses records in ${name}'s range`, {
        first_bad_seq: first === undefined ? from : row.last_seq,
      });
    }
    return {
      kind: 'chain' as const,
      partition: row,
      first: { seq: from, ...first },
      last: { seq: row.last_seq, hash: last.hash },
    };
  }

  private async sealed(name: string) {
    const closed = await this.closed(name);
    if (closed.kind === 'leaves') {
      const checkpoint = await closed.leaves.sealOf(closed.range);
      if (checkpoint === undefined) return unsealed(name);
      return { ...closed, partition: { checkpoint } };
    }
    const checkpoint = await this.sealOf(closed.partition);
    if (checkpoint === undefined) return unsealed(name);
    return {
      ...closed,
      partition: {
        ...(await this.describe(closed.partition, await readChainEnd(this.options.database.control))),
        checkpoint,
      },
    };
  }
}

type ChainEnd = { seq: number; closed: boolean };

/** A month holding records of after the chain closed: it archives a range of leaves (the chain's last among them). */
function holdsLeaves(row: PartitionRow, chain: ChainEnd): boolean {
  return chain.closed && row.last_seq !== null && row.last_seq > chain.seq;
}

function unsealed(name: string): never {
  throw new CodedError('partition_not_sealed', `${name} has no trusted checkpoint at its last record: seal it first`, {
    partition: name,
    reason: 'unsealed',
  });
}

/** A detach that waited its time for the log's lock is refused as busy, rather than stall appends behind it. */
async function busyIfLocked<T>(name: string, detach: () => Promise<T>): Promise<T> {
  try {
    return await detach();
  } catch (error) {
    if ((error as { code?: string }).code === '55P03') {
      throw new CodedError('gateway_unavailable', 'the audit log is busy (a long read holds it); detach again later', {
        partition: name,
      });
    }
    throw error;
  }
}
