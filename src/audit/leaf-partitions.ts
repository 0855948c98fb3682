import { randomUUID } from 'node:crypto';
import type { PassThrough } from 'node:stream';
import type { Logger } from 'pino';
import type { Database } from '../db/database.js';
import { CodedError } from '../errors/coded-error.js';
import { writeAuditEvents, type ChainHead } from './audit-repository.js';
import { GENESIS_HASH } from './audit-hash.js';
import type { AuditTree, ChainPart, LeafWalk } from './audit-tree.js';
import { walkRange } from './chain-verification.js';
import { recordCheckpointCreated } from './audit-checkpoints.js';
import { insertCheckpoint, sealsAtLeaf } from './checkpoint-repository.js';
import type { Checkpoint, CheckpointSigner } from './checkpoint-signer.js';
import {
  LEAF_PARTITION_FILE_FORMAT,
  exportStream,
  fileLine,
  type LeafPartitionFileHeader,
  type WriteLines,
} from './partition-file.js';
import {
  detachPartition,
  detachReportsIn,
  findLink,
  insertArchive,
  lastLeafOf,
  listArchives,
  type PartitionRow,
} from './partition-repository.js';
import { leafSeqsAt } from './tree-repository.js';

/**
 * The leaves a month archives: from where the last archived range ended to its last leaf, and, in the month
 * the chain closed in, the chain's last records among them (its first leaves, in seq order).
 */
export interface LeafRange {
  from_leaf: number;
  to_leaf: number;
  chain?: ChainPart;
}

export interface LeafPartitionsOptions {
  database: Database;
  signer: CheckpointSigner;
  tree: AuditTree;
  now: () => Date;
  logger: Logger;
}

/**
 * The months of a log that is leaves only: each archives a contiguous range of the Merkle tree's leaves,
 * sealed by a signed checkpoint at its last leaf, exported with the tree's evidence for the range, and
 * detached once exported (docs/design/audit-chain.md#leaf-partitions).
 */
export class LeafPartitions {
  constructor(private readonly options: LeafPartitionsOptions) {}

  /**
   * The range a finished month archives, or why it cannot yet: `unsequenced` while a record of it is not a
   * leaf, `empty` when its records all sit in ranges archived before.
   */
  async range(row: PartitionRow, chainEnd: number): Promise<LeafRange | 'unsequenced' | 'empty'> {
    const db = this.options.database.control;
    const [{ lastLeaf, unsequenced }, archives] = await Promise.all([lastLeafOf(db, row.name), listArchives(db)]);
    if (unsequenced > 0) return 'unsequenced';
    // The chain's records are the first leaves, the record at seq s the leaf s − 1: a range of the chain ends
    // before the leaf numbered as its last seq.
    const from = archives.reduce(
      (end, a) => Math.max(end, a.to_leaf === null ? Number(a.to_seq) : Number(a.to_leaf) + 1),
      0,
    );
    if (lastLeaf === null || lastLeaf < from) return 'empty';
    if (from >= chainEnd) return { from_leaf: from, to_leaf: lastLeaf };
    const fromSeq = from + 1;
    const chainArchives = archives.filter((a) => a.prev_hash !== null);
    const [first, last, before] = await Promise.all([
      findLink(db, fromSeq),
      findLink(db, chainEnd),
      fromSeq === 1 ? { hash: GENESIS_HASH } : findLink(db, fromSeq - 1),
    ]);
    const prev = before?.hash ?? chainArchives.find((a) => Number(a.to_seq) === fromSeq - 1)?.last_hash;
    if (first === undefined || last === undefined || prev === undefined || lastLeaf < chainEnd - 1) {
      throw new CodedError('audit_chain_broken', `the audit chain misses records in ${row.name}'s range`, {
        first_bad_seq: fromSeq,
      });
    }
    const chain = {
      from_seq: fromSeq,
      to_seq: chainEnd,
      prev_hash: prev,
      first_hash: first.hash,
      last_hash: last.hash,
    };
    return { from_leaf: from, to_leaf: lastLeaf, chain };
  }

  /** A trusted seal at the range's last leaf, naming the record there. */
  async sealOf(range: LeafRange): Promise<Checkpoint | undefined> {
    const db = this.options.database.control;
    const [seals, [seq]] = await Promise.all([sealsAtLeaf(db, range.to_leaf), leafSeqsAt(db, range.to_leaf)]);
    return seals.find((c) => c.seq === seq && this.options.signer.distrust(c) === null);
  }

  /** Proves the range's leaves under the latest checkpoint, then signs a seal at its last leaf. */
  async seal(name: string, range: LeafRange, actor: string): Promise<Checkpoint> {
    const walked = await this.proven(name, range, await this.options.tree.walkLeaves(range.from_leaf, range.to_leaf));
    const checkpoint = this.options.signer.sign({
      id: `ckpt_${randomUUID()}`,
      seq: walked.last.seq,
      hash: walked.last.hash,
      leaf_index: range.to_leaf,
      at: this.options.now().toISOString(),
      created_by: actor,
    });
    await this.options.database.control.transaction().execute(async (trx) => {
      await insertCheckpoint(trx, checkpoint);
      await recordCheckpointCreated(trx, checkpoint, actor, this.options.now(), {
        partition: name,
        leaf_index: range.to_leaf,
      });
    });
    return checkpoint;
  }

  /** The range as JSON Lines (format v4): its records in leaf order, proven as they are read. */
  export(partition: PartitionRow, range: LeafRange, seal: Checkpoint): PassThrough {
    const produce = async (write: WriteLines): Promise<Checkpoint> => {
      // The header says what the stored tree holds; the records are then proven under that same checkpoint.
      const head = await this.options.tree.leafRange(range.from_leaf, range.to_leaf);
      if (head === undefined) throw new Error(`${partition.name}'s last leaf is not under a valid checkpoint`);
      const header: LeafPartitionFileHeader = {
        type: 'header',
        format: LEAF_PARTITION_FILE_FORMAT,
        partition: partition.name,
        range_start: partition.range_start?.toISOString() ?? null,
        range_end: partition.range_end?.toISOString() ?? null,
        first_leaf_index: range.from_leaf,
        last_leaf_index: range.to_leaf,
        first_seq: head.first.seq,
        last_seq: head.last.seq,
        first_hash: head.first.hash,
        last_hash: head.last.hash,
        rows: range.to_leaf - range.from_leaf + 1,
        exported_at: this.options.now().toISOString(),
        tree: head.evidence,
        ...(range.chain === undefined ? {} : { chain: chainOf(range.chain) }),
      };
      await write([fileLine(header)]);
      const size = head.evidence.tree_size;
      const walked = await this.options.tree.walkLeaves(range.from_leaf, range.to_leaf, write, size);
      if (!walked.ok || walked.last.hash !== seal.hash || !sameChain(walked.chain, range.chain))
        throw new Error(`${partition.name}'s leaves do not verify as sealed`);
      return seal;
    };
    return exportStream(produce, (error) =>
      this.options.logger.warn({ err: error, partition: partition.name }, 'audit partition export failed'),
    );
  }

  /**
   * Detaches the month once its range still ends at the record named as exported and its leaves still
   * verify, recording `audit.partition_detached` and the archived range in one transaction.
   */
  async detach(
    partition: PartitionRow,
    range: LeafRange,
    seal: Checkpoint,
    actor: string,
    confirm: ChainHead,
    lockTimeout: string,
  ): Promise<{ eventSeq: number; at: Date; rows: number; first_seq: number; last_seq: number }> {
    const name = partition.name;
    if (confirm.seq !== seal.seq || confirm.hash !== seal.hash) {
      throw new CodedError('partition_not_sealed', `${name} does not end at the record named as exported`, {
        partition: name,
        reason: 'mismatch',
        last_seq: seal.seq,
        last_hash: seal.hash,
      });
    }
    const db = this.options.database.control;
    const walked = await this.proven(name, range, await this.options.tree.walkLeaves(range.from_leaf, range.to_leaf));
    if (walked.last.hash !== seal.hash) {
      throw new CodedError('audit_chain_broken', `${name} no longer ends as sealed; it stays attached`, {
        first_bad_leaf_index: range.to_leaf,
      });
    }
    const rows = range.to_leaf - range.from_leaf + 1;
    const { chain } = range;
    const details = {
      partition: name,
      from_leaf: range.from_leaf,
      to_leaf: range.to_leaf,
      first_seq: walked.first.seq,
      last_seq: walked.last.seq,
      first_leaf_hash: walked.first.hash,
      last_leaf_hash: walked.last.hash,
      rows,
      checkpoint_id: seal.id,
      // The chain's last records, as a range of the chain reports them: what the chain's walk crosses.
      ...(chain === undefined ? {} : chainOf(chain)),
      // The reports this month holds leave with it, with those they carried: the newest report left in the
      // log carries every report that left before it.
      archived_records: (await detachReportsIn(db, name)).flatMap(({ event_seq, details: report }) => {
        const { archived_records: carried, ...own } = report as { archived_records?: unknown[] };
        return [{ event_seq, ...own }, ...(carried ?? [])];
      }),
    };
    const at = this.options.now();
    const eventSeq = await db.transaction().execute(async (trx) => {
      await detachPartition(trx, name, lockTimeout);
      const [record] = await writeAuditEvents(trx, [
        { event: { event_type: 'audit.partition_detached', actor, details }, occurredAt: at },
      ]);
      await insertArchive(trx, {
        event_seq: record!.seq,
        partition: name,
        ...(chain === undefined
          ? {
              from_seq: walked.first.seq,
              to_seq: walked.last.seq,
              prev_hash: null,
              first_hash: walked.first.hash,
              last_hash: walked.last.hash,
            }
          : {
              from_seq: chain.from_seq,
              to_seq: chain.to_seq,
              prev_hash: chain.prev_hash,
              first_hash: chain.first_hash,
              last_hash: chain.last_hash,
            }),
        last_leaf_hash: walked.last.hash,
        row_count: rows,
        checkpoint_id: seal.id,
        detached_by: actor,
        detached_at: at,
        from_leaf: range.from_leaf,
        to_leaf: range.to_leaf,
      });
      return record!.seq;
    });
    return { eventSeq, at, rows, first_seq: walked.first.seq, last_seq: walked.last.seq };
  }

  /** The walk's verdict as an answer; in the month the chain closed in, with the chain's last records walked too. */
  private async proven(name: string, range: LeafRange, walked: LeafWalk): Promise<Extract<LeafWalk, { ok: true }>> {
    if (!walked.ok && walked.reason === 'not_covered') {
      throw new CodedError('partition_not_sealed', `${name}'s last leaf is not under a signed checkpoint yet`, {
        partition: name,
        reason: 'unsequenced',
      });
    }
    if (!walked.ok) {
      throw new CodedError('audit_chain_broken', `${name}'s leaves do not verify against the signed tree`, {
        first_bad_leaf_index: walked.first_bad_leaf_index,
      });
    }
    const { chain } = range;
    if (chain === undefined) return walked;
    const linked = await walkRange(
      this.options.database.control,
      { seq: chain.from_seq - 1, hash: chain.prev_hash },
      { seq: chain.to_seq, hash: chain.last_hash },
    );
    if (!linked.ok || !sameChain(walked.chain, chain)) {
      throw new CodedError('audit_chain_broken', `the audit chain does not verify up to its end in ${name}`, {
        first_bad_seq: linked.first_bad_seq ?? chain.from_seq,
      });
    }
    return walked;
  }
}

/** A range of the chain as its archive and its report name it. */
function chainOf(chain: ChainPart): Omit<ChainPart, 'first_hash'> {
  const { from_seq, to_seq, prev_hash, last_hash } = chain;
  return { from_seq, to_seq, prev_hash, last_hash };
}

/** Whether the chain's records a walk read are the part the range expects. */
function sameChain(read: Omit<ChainPart, 'first_hash'> | undefined, expected: ChainPart | undefined): boolean {
  if (read === undefined || expected === undefined) return read === expected;
  return (
    read.from_seq === expected.from_seq &&
    read.to_seq === expected.to_seq &&
    read.prev_hash === expected.prev_hash &&
    read.last_hash === expected.last_hash
  );
}
