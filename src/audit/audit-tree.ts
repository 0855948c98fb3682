import { createPublicKey } from 'node:crypto';
import type { Kysely, Transaction } from 'kysely';
import type { Database } from '../db/database.js';
import type { DB } from '../db/schema.js';
import { CodedError } from '../errors/coded-error.js';
import { firstUnreportedLeaves, readArchivedLeaves } from './archived-leaves.js';
import { readArchivedRanges } from './chain-verification.js';
import { canonicalJson, HASH_SCHEME } from './audit-hash.js';
import { leafRecordReader, readLeafRecords, type LeafRecord } from './hashed-rows.js';
import {
  CompactRange,
  consistencyProof,
  inclusionProof,
  leafHash,
  subtreesAfter,
  type Hash,
  type NodeReader,
} from './merkle.js';
import { TILE_WIDTH, tileReader, tilesRead } from './merkle-tiles.js';
import { openNote, parseCheckpoint, verifierKeyOf, type NoteSigner } from './signed-note.js';
import {
  eventIdsAt,
  findLeaves,
  findTreeCheckpoint,
  leafSeqs,
  leafSeqsAt,
  readTiles,
  runRecordSeqs,
  unsequencedSeqOf,
  type StoredCheckpoint,
} from './tree-repository.js';

/** Whose records a caller may see: a tenant's only, or (undefined) every tenant's. */
export type TenantScope = string | undefined;

export interface TreeEvent {
  record: Record<string, unknown>;
  seq: number;
  leaf_index: number | null;
  leaf_hash: string | null;
}

export interface InclusionProof {
  leaf_index: number;
  tree_size: number;
  leaf_hash: string;
  proof: string[];
}

export interface Receipt {
  checkpoint: string | null;
  tree_size: number;
  records: Array<{ record: Record<string, unknown>; leaf_index: number; leaf_hash: string; proof: string[] }>;
  pending: Array<{ record: Record<string, unknown> }>;
}

/** The tree's evidence for a contiguous range of records: see `AuditTree.rangeEvidence`. */
export interface RangeEvidence {
  /** The signed note of the checkpoint the range is proven against. */
  checkpoint: string;
  tree_size: number;
  first_leaf_index: number;
  /** The compact range of the leaves before the range (its complete subtrees, largest first). */
  left: string[];
  /** The complete subtrees after the range, in order, up to `tree_size`. */
  right: string[];
}

/** Why a range of leaves does not verify: not under a valid checkpoint yet, a record gone or edited. */
export type LeafWalkFailure = 'not_covered' | 'record_missing' | 'root_mismatch';

/** A range's first or last leaf: its place, its record's seq and its leaf hash (hex). */
export interface LeafEnd {
  leaf_index: number;
  seq: number;
  hash: string;
}

/** A range of leaves as the stored tree gives it: see `AuditTree.leafRange`. */
export interface LeafRangeHead {
  evidence: RangeEvidence;
  first: LeafEnd;
  last: LeafEnd;
  rootHash: Buffer;
  left: CompactRange;
  right: Array<{ level: number; hash: Hash }>;
}

/** The records of the linear chain a range of leaves holds (its first leaves, in seq order), as stored. */
export interface ChainPart {
  from_seq: number;
  to_seq: number;
  /** The hash the first chains from, the first one's and the last one's. */
  prev_hash: string;
  first_hash: string;
  last_hash: string;
}

export type LeafWalk =
  | { ok: true; first: LeafEnd; last: LeafEnd; chain: ChainPart | undefined }
  | { ok: false; first_bad_leaf_index: number | null; reason: LeafWalkFailure };

/** Leaves read per page by `walkLeaves`. */
const LEAF_PAGE = 10_000;

export interface TreeVerification {
  ok: boolean;
  tree_size: number;
  from_tree_size: number;
  /** Leaves recomputed from the stored records. */
  checked: number;
  /** The first leaf whose record is edited or gone; null when the leaves hold but the root does not. */
  first_bad_leaf_index: number | null;
  reason: 'record_changed' | 'record_missing' | 'root_mismatch' | 'checkpoint_invalid' | null;
}

const b64 = (hash: Hash): string => hash.toString('base64');

/**
 * The log as a verifiable Merkle tree: checkpoints, records with their place in it, proofs, receipts
 * and verification (SPEC §8.1). Reads only; `LogSequencer` writes.
 */
export class AuditTree {
  /** The verifier keys checkpoints are checked with: this log's, then earlier keys still trusted. */
  private readonly trusted: string[];

  constructor(
    private readonly database: Database,
    private readonly signer: NoteSigner,
    private readonly sequenceIntervalMs: number,
    /** PEM public keys of earlier signing keys whose checkpoints stay trusted (`TOOLGATE_AUDIT_VERIFY_KEYS`). */
    earlierKeysPem: string[] = [],
  ) {
    this.trusted = [
      signer.verifierKey,
      ...earlierKeysPem.map((pem) => verifierKeyOf(signer.name, createPublicKey(pem))),
    ];
  }

  logInfo(): { origin: string; verifier_key: string; sequence_interval_ms: number } {
    return {
      origin: this.signer.name,
      verifier_key: this.signer.verifierKey,
      sequence_interval_ms: this.sequenceIntervalMs,
    };
  }

  /** The signed note of the latest checkpoint, or of the one of that size. */
  async checkpoint(treeSize?: number): Promise<string> {
    const found = await findTreeCheckpoint(this.database.control, treeSize);
    if (found === undefined)
      throw new CodedError(
        'not_found',
        treeSize === undefined ? 'no checkpoint is published yet' : `no checkpoint of tree size ${treeSize}`,
      );
    return found.note;
  }

  async event(eventId: string, scope: TenantScope): Promise<TreeEvent> {
    const db = this.database.control;
    let leaf = (await findLeaves(db, [eventId])).get(eventId);
    let seq = leaf?.seq ?? (await unsequencedSeqOf(db, eventId));
    if (seq === undefined) {
      // Sequenced between the two reads.
      leaf = (await findLeaves(db, [eventId])).get(eventId);
      seq = leaf?.seq;
    }
    const record = seq === undefined ? undefined : await this.recordAt(seq, scope);
    if (record === undefined) throw new CodedError('not_found', `no audit record ${eventId}`);
    // The leaf as sequenced, from the tree: a record edited since no longer hashes to it.
    const stored = leaf === undefined ? undefined : await this.prove((read) => read(0, leaf!.leafIndex));
    return {
      record: JSON.parse(record.canonical) as Record<string, unknown>,
      seq: record.seq,
      leaf_index: leaf?.leafIndex ?? null,
      leaf_hash: stored === undefined ? null : b64(stored),
    };
  }

  async inclusion(eventId: string, scope: TenantScope, treeSize?: number): Promise<InclusionProof> {
    const event = await this.event(eventId, scope);
    const size = await this.provableSize(treeSize);
    if (event.leaf_index === null || event.leaf_index >= size)
      throw new CodedError('not_found', `audit record ${eventId} is not in the tree of size ${size} yet`, {
        leaf_index: event.leaf_index,
      });
    const index = event.leaf_index;
    const proof = await this.prove((read) => inclusionProof(read, index, size));
    return { leaf_index: index, tree_size: size, leaf_hash: event.leaf_hash!, proof: proof.map(b64) };
  }

  async consistency(first: number, second: number): Promise<{ first: number; second: number; proof: string[] }> {
    if (first > second) throw new CodedError('invalid_request', 'first must not exceed second', { first, second });
    await this.provableSize(second);
    const proof = await this.prove((read) => consistencyProof(read, first, second));
    return { first, second, proof: proof.map(b64) };
  }

  /** A run's records with their inclusion proofs against the latest checkpoint; those not yet in it, pending. */
  async receipt(runId: string, tenantId: string, agentId?: string): Promise<Receipt> {
    const db = this.database.control;
    const latest = await findTreeCheckpoint(db);
    const size = latest?.treeSize ?? 0;
    const seqs = await runRecordSeqs(db, tenantId, runId, agentId);
    if (seqs.length === 0) throw new CodedError('not_found', `no run ${runId}`);
    const records = await readRecords(db, seqs);
    const leaves = await findLeaves(
      db,
      records.map((r) => r.eventId),
    );
    const covered = records.filter((r) => (leaves.get(r.eventId)?.leafIndex ?? size) < size);
    const proofs = await this.prove((read) =>
      covered.map((r) => {
        const index = leaves.get(r.eventId)!.leafIndex;
        return { leaf: read(0, index), proof: inclusionProof(read, index, size) };
      }),
    );
    return {
      checkpoint: latest?.note ?? null,
      tree_size: size,
      records: covered.map((r, i) => ({
        record: JSON.parse(r.canonical) as Record<string, unknown>,
        leaf_index: leaves.get(r.eventId)!.leafIndex,
        leaf_hash: b64(proofs[i]!.leaf),
        proof: proofs[i]!.proof.map(b64),
      })),
      pending: records
        .filter((r) => !covered.includes(r))
        .map((r) => ({ record: JSON.parse(r.canonical) as Record<string, unknown> })),
    };
  }

  /**
   * What proves, offline, that the records `firstSeq` … `lastSeq` (sequenced in seq order) are leaves of the latest
   * checkpoint's tree: that checkpoint, the index of the first, and the subtrees before and after the range
   * (a partition's export carries it). Undefined while the range is not all covered by a checkpoint.
   */
  async rangeEvidence(firstSeq: number, lastSeq: number): Promise<RangeEvidence | undefined> {
    const db = this.database.control;
    const ids = await eventIdsAt(db, [firstSeq, lastSeq]);
    const leaves = await findLeaves(db, [...ids.values()]);
    const first = leaves.get(ids.get(firstSeq) ?? '');
    const last = leaves.get(ids.get(lastSeq) ?? '');
    const latest = await findTreeCheckpoint(db);
    if (first === undefined || last === undefined || latest === undefined || last.leafIndex >= latest.treeSize)
      return undefined;
    if (last.leafIndex - first.leafIndex !== lastSeq - firstSeq) return undefined;
    const size = latest.treeSize;
    const { left, right } = await this.prove((read) => ({
      left: CompactRange.of(read, first.leafIndex).hashes(),
      right: subtreesAfter(last.leafIndex + 1, size).map(({ level, index }) => read(level, index)),
    }));
    return {
      checkpoint: latest.note,
      tree_size: size,
      first_leaf_index: first.leafIndex,
      left: left.map(b64),
      right: right.map(b64),
    };
  }

  /**
   * The evidence for leaves `from` … `to` under a valid checkpoint (the latest, or that of `treeSize`), and the
   * leaves at both ends, from the stored tree alone: what an export's header says before its records prove it.
   */
  async leafRange(from: number, to: number, treeSize?: number): Promise<LeafRangeHead | undefined> {
    const db = this.database.control;
    const checkpoint = await findTreeCheckpoint(db, treeSize);
    if (checkpoint === undefined || to >= checkpoint.treeSize || !this.valid(checkpoint)) return undefined;
    const size = checkpoint.treeSize;
    const after = subtreesAfter(to + 1, size);
    const { left, right, first, last } = await this.prove((read) => ({
      left: CompactRange.of(read, from),
      right: after.map(({ level, index }) => read(level, index)),
      first: read(0, from),
      last: read(0, to),
    }));
    const [firstSeq, lastSeq] = await leafSeqsAt(db, from, to);
    if (firstSeq === undefined || lastSeq === undefined) return undefined;
    return {
      evidence: {
        checkpoint: checkpoint.note,
        tree_size: size,
        first_leaf_index: from,
        left: left.hashes().map(b64),
        right: right.map(b64),
      },
      first: { leaf_index: from, seq: firstSeq, hash: first.toString('hex') },
      last: { leaf_index: to, seq: lastSeq, hash: last.toString('hex') },
      rootHash: checkpoint.rootHash,
      left,
      right: right.map((hash, i) => ({ level: after[i]!.level, hash })),
    };
  }

  /**
   * Walks leaves `from` … `to` in leaf order, recomputing each from its record, and proves them, between the
   * stored subtrees on either side, the leaves of a valid checkpoint's tree (the latest, or that of `treeSize`):
   * what seals, exports and detaches a month of leaf records. With `onLines`, each page as lines of an export.
   */
  async walkLeaves(
    from: number,
    to: number,
    onLines?: (lines: string[]) => Promise<void>,
    treeSize?: number,
  ): Promise<LeafWalk> {
    const db = this.database.control;
    const head = await this.leafRange(from, to, treeSize);
    if (head === undefined) return { ok: false, first_bad_leaf_index: null, reason: 'not_covered' };
    const range = head.left;
    let chain: ChainPart | undefined;
    const bad = (at: number, reason: LeafWalkFailure): LeafWalk => ({ ok: false, first_bad_leaf_index: at, reason });
    for (let at = from; at <= to; at += LEAF_PAGE) {
      const end = Math.min(to + 1, at + LEAF_PAGE);
      // A page at a time, in its own transaction: one held for a month's export would keep vacuum from every table.
      const page = await db.transaction().execute(async (trx) => {
        const seqs = await leafSeqs(trx, at, end);
        const records = new Map((await readLeafRecords(trx, { seqs })).map((r) => [r.seq, r]));
        return seqs.map((seq) => ({ seq, record: records.get(seq) }));
      });
      const lines: string[] = [];
      for (let i = 0; i < end - at; i += 1) {
        const { seq, record } = page[i] ?? {};
        if (seq === undefined || record === undefined) return bad(at + i, 'record_missing');
        range.append(leafHash(record.canonical));
        if (record.chain !== undefined) {
          chain ??= {
            from_seq: seq,
            to_seq: seq,
            prev_hash: record.chain.prevHash,
            first_hash: record.chain.hash,
            last_hash: record.chain.hash,
          };
          chain.to_seq = seq;
          chain.last_hash = record.chain.hash;
        }
        if (onLines !== undefined) lines.push(exportLine(record, at + i));
      }
      if (onLines !== undefined) await onLines(lines);
    }
    for (const { level, hash } of head.right) range.appendSubtree(level, hash);
    if (!range.root().equals(head.rootHash)) return { ok: false, first_bad_leaf_index: null, reason: 'root_mismatch' };
    return { ok: true, first: head.first, last: head.last, chain };
  }

  /**
   * Recomputes leaves from the stored records and the root of the latest checkpoint: all of them, or those
   * appended after the checkpoint of `fromTreeSize` (whose tree the stored tiles must still give).
   */
  async verify(fromTreeSize = 0, pageSize = 10_000): Promise<TreeVerification> {
    return this.database.control
      .transaction()
      .setIsolationLevel('repeatable read')
      .setAccessMode('read only')
      .execute(async (trx) => {
        const latest = await findTreeCheckpoint(trx);
        const size = latest?.treeSize ?? 0;
        const result = (fields: Partial<TreeVerification>): TreeVerification => ({
          ok: false,
          tree_size: size,
          from_tree_size: fromTreeSize,
          checked: 0,
          first_bad_leaf_index: null,
          reason: null,
          ...fields,
        });
        if (latest === undefined) return result({ ok: fromTreeSize === 0, tree_size: 0 });
        if (!this.valid(latest)) return result({ reason: 'checkpoint_invalid' });
        if (fromTreeSize > size)
          throw new CodedError('not_found', `no checkpoint of tree size ${fromTreeSize}`, { tree_size: size });
        let range = new CompactRange();
        if (fromTreeSize > 0) {
          const from = await findTreeCheckpoint(trx, fromTreeSize);
          if (from === undefined) throw new CodedError('not_found', `no checkpoint of tree size ${fromTreeSize}`);
          if (!this.valid(from)) return result({ reason: 'checkpoint_invalid' });
          range = await proveWith(trx, (read) => CompactRange.of(read, fromTreeSize));
          if (!range.root().equals(from.rootHash)) return result({ reason: 'root_mismatch' });
        }
        // Records of partitions detached after export are not in the database: their leaves stand as stored,
        // once the log reports each detachment as it was made.
        const archived = [...(await readArchivedRanges(trx)).values()];
        const archivedLeaves = await readArchivedLeaves(trx);
        const unreported = await firstUnreportedLeaves(trx, archivedLeaves);
        if (unreported !== undefined) return result({ first_bad_leaf_index: unreported, reason: 'record_missing' });
        const inArchive = (seq: number, index: number) =>
          archived.some((r) => r.from_seq <= seq && seq <= r.to_seq) ||
          archivedLeaves.some((r) => r.from_leaf <= index && index <= r.to_leaf);
        let checked = 0;
        const read = await leafRecordReader(trx);
        for (let at = fromTreeSize; at < size; at += pageSize) {
          const end = Math.min(size, at + pageSize);
          const seqs = await leafSeqs(trx, at, end);
          const records = new Map((await read({ seqs })).map((r) => [r.seq, r]));
          const stored = await readTiles(
            trx,
            range0Tiles(at, end).map((index) => ({ level: 0, index })),
          );
          const storedLeaf = tileReader(stored);
          for (let i = 0; i < end - at; i += 1) {
            const seq = seqs[i];
            const record = seq === undefined ? undefined : records.get(seq);
            if (record === undefined && seq !== undefined && inArchive(seq, at + i)) {
              range.append(storedLeaf(0, at + i));
              continue;
            }
            if (record === undefined)
              return result({ checked, first_bad_leaf_index: at + i, reason: 'record_missing' });
            const leaf = leafHash(record.canonical);
            if (!leaf.equals(storedLeaf(0, at + i)))
              return result({ checked, first_bad_leaf_index: at + i, reason: 'record_changed' });
            range.append(leaf);
            checked += 1;
          }
        }
        if (!range.root().equals(latest.rootHash)) return result({ checked, reason: 'root_mismatch' });
        return result({ ok: true, checked });
      });
  }

  /** Whether a stored checkpoint is signed by this log's key and says what its row says. */
  private valid(checkpoint: StoredCheckpoint): boolean {
    const text = this.trusted.map((key) => openNote(checkpoint.note, key)).find((opened) => opened !== undefined);
    const head = text === undefined ? undefined : parseCheckpoint(text);
    return head !== undefined && head.size === checkpoint.treeSize && head.root.equals(checkpoint.rootHash);
  }

  /** The tree size a proof is asked against: the latest checkpoint's, or one no larger. */
  private async provableSize(treeSize?: number): Promise<number> {
    const latest = await findTreeCheckpoint(this.database.control);
    const size = latest?.treeSize ?? 0;
    if (treeSize === undefined) return size;
    if (treeSize > size)
      throw new CodedError('not_found', `no checkpoint covers tree size ${treeSize} yet`, { tree_size: size });
    return treeSize;
  }

  private prove<T>(run: (read: NodeReader) => T): Promise<T> {
    return proveWith(this.database.control, run);
  }

  private async recordAt(seq: number, scope: TenantScope): Promise<LeafRecord | undefined> {
    const [record] = await readRecords(this.database.control, [seq]);
    if (record === undefined) return undefined;
    if (scope !== undefined && (JSON.parse(record.canonical) as { tenant_id?: unknown }).tenant_id !== scope)
      return undefined;
    return record;
  }
}

/** Runs a computation over the tree after fetching, in one query, the tiles it reads. */
async function proveWith<T>(db: Kysely<DB> | Transaction<DB>, run: (read: NodeReader) => T): Promise<T> {
  const tiles = await readTiles(db, tilesRead(run));
  return run(tileReader(tiles));
}

function readRecords(db: Kysely<DB>, seqs: number[]): Promise<LeafRecord[]> {
  return db.transaction().execute((trx) => readLeafRecords(trx, { seqs }));
}

/** The level-0 tiles holding leaves [from, to). */
function range0Tiles(from: number, to: number): number[] {
  const tiles: number[] = [];
  for (let index = Math.floor(from / TILE_WIDTH); index * TILE_WIDTH < to; index += 1) tiles.push(index);
  return tiles;
}

/**
 * A record as a line of a range's export: its fields and its place. A leaf record's leaf bytes are the line
 * without `leaf_index`, `seq` and `hash_scheme`; a linked record's also without `prev_hash` and `hash`; an
 * older record's (hashed whole, its seq inside) without `leaf_index` and `hash`.
 */
function exportLine(record: LeafRecord, leafIndex: number): string {
  const fields = JSON.parse(record.canonical) as Record<string, unknown>;
  const { chain, seq } = record;
  const line =
    chain === undefined
      ? { ...fields, hash_scheme: HASH_SCHEME.leaf, leaf_index: leafIndex, seq }
      : chain.scheme === 'linked'
        ? {
            ...fields,
            hash: chain.hash,
            hash_scheme: HASH_SCHEME.linked,
            leaf_index: leafIndex,
            prev_hash: chain.prevHash,
            seq,
          }
        : { ...fields, hash: chain.hash, leaf_index: leafIndex };
  return canonicalJson(line) ?? '{}';
}
