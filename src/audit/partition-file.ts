import { createHash, createPublicKey } from 'node:crypto';
import { once } from 'node:events';
import { PassThrough } from 'node:stream';
import { canonicalJson, HASH_SCHEME, linkHash } from './audit-hash.js';
import type { RangeEvidence } from './audit-tree.js';
import { CheckpointSigner, keyIdOf, type Checkpoint } from './checkpoint-signer.js';
import { CompactRange, leafHash, subtreesAfter } from './merkle.js';
import { openNote, parseCheckpoint, verifierKeyOf } from './signed-note.js';

/**
 * The export format's name, in its header: a file names the rules it is verified by. Version 2 adds
 * records linked in the database (`hash_scheme` 2); version 3 the Merkle tree's evidence for the
 * records (`tree` in the header); older files verify by the same rules, without it.
 */
export const PARTITION_FILE_FORMAT = 'toolgate-audit-partition-v3';
/** A month of leaf records: a range of the tree's leaves, bound by its evidence to a signed checkpoint. */
export const LEAF_PARTITION_FILE_FORMAT = 'toolgate-audit-partition-v4';
const READABLE_FORMATS: readonly string[] = [
  'toolgate-audit-partition-v1',
  'toolgate-audit-partition-v2',
  PARTITION_FILE_FORMAT,
  LEAF_PARTITION_FILE_FORMAT,
];

/** The first line of an exported partition. */
export interface PartitionFileHeader {
  type: 'header';
  format: string;
  partition: string;
  /**
   * The partition's bounds on `occurred_at`, [range_start, range_end), null where unbounded: for
   * reading only, as a record of a neighbouring month inside the range may fall outside them.
   */
  range_start: string | null;
  range_end: string | null;
  first_seq: number;
  last_seq: number;
  /** The hash of the record before `first_seq`, which the first record chains from. */
  prev_hash: string;
  first_hash: string;
  last_hash: string;
  rows: number;
  exported_at: string;
  /** That the records are leaves `first_leaf_index` … of a signed checkpoint's tree (absent: not yet covered). */
  tree?: RangeEvidence;
}

/**
 * The first line of an exported month of leaf records: leaves `first_leaf_index` … `last_leaf_index`, the
 * records there (`first_seq`, `last_seq`) and their leaf hashes, and the tree's evidence for the range.
 */
export interface LeafPartitionFileHeader {
  type: 'header';
  format: typeof LEAF_PARTITION_FILE_FORMAT;
  partition: string;
  range_start: string | null;
  range_end: string | null;
  first_leaf_index: number;
  last_leaf_index: number;
  first_seq: number;
  last_seq: number;
  first_hash: string;
  last_hash: string;
  rows: number;
  exported_at: string;
  tree: RangeEvidence;
  /**
   * The records of the linear chain among the leaves (its last ones, from a log whose chain closed in this
   * month): they chain from `prev_hash` to `last_hash`, as the archive records for the chain's walk.
   */
  chain?: { from_seq: number; to_seq: number; prev_hash: string; last_hash: string };
}

/** The last line: the checkpoint at `last_seq` that vouches for the range, and a digest of the lines before. */
export interface PartitionFileTrailer {
  type: 'trailer';
  checkpoint: Checkpoint;
  /** SHA-256 of every line before this one, each with its newline. */
  lines_sha256: string;
}

/** Writes lines to an export, awaiting the reader: fails once the reader is gone. */
export type WriteLines = (lines: string[]) => Promise<void>;

/**
 * An export as a stream: `produce` writes its header and records, and the stream ends with the trailer
 * carrying `checkpoint` and the SHA-256 of every line before it. A failure ends the stream early (a file
 * without its trailer is incomplete) and is reported to `failed`.
 */
export function exportStream(
  produce: (write: WriteLines) => Promise<Checkpoint>,
  failed: (error: Error) => void,
): PassThrough {
  const stream = new PassThrough();
  const digest = createHash('sha256');
  const write: WriteLines = async (lines) => {
    const text = lines.map((line) => `${line}\n`).join('');
    digest.update(text);
    if (stream.destroyed) throw new Error('the export was abandoned');
    if (!stream.write(text)) await Promise.race([once(stream, 'drain'), once(stream, 'close')]);
  };
  produce(write).then(
    (checkpoint) => {
      const trailer: PartitionFileTrailer = { type: 'trailer', checkpoint, lines_sha256: digest.digest('hex') };
      stream.end(`${fileLine(trailer)}\n`);
    },
    (error: unknown) => {
      const reason = error instanceof Error ? error : new Error(String(error));
      failed(reason);
      stream.destroy(reason);
    },
  );
  return stream;
}

/** One line of JSON as the file holds it: canonical, so that a byte changed anywhere shows. */
export function fileLine(value: PartitionFileHeader | LeafPartitionFileHeader | PartitionFileTrailer): string {
  return canonicalJson(value) ?? '{}';
}

export interface PartitionFileVerification {
  ok: boolean;
  /** Records whose hashes were recomputed and chained. */
  checked: number;
  /** The first line (1-based) that does not verify, and why. */
  first_bad_line: number | null;
  reason: string | null;
  header: PartitionFileHeader | LeafPartitionFileHeader | null;
  checkpoint: Pick<Checkpoint, 'id' | 'seq' | 'hash' | 'key_id'> | null;
  /** Whether the checkpoint's signature was checked against the given key (false only when unsigned and allowed). */
  signature_checked: boolean;
  /** The signed tree the records were proven leaves of, when a log key was given. */
  tree: { tree_size: number; first_leaf_index: number } | null;
}

const HASH_SUFFIX = /,"hash":"([0-9a-f]{64})"\}$/;

/**
 * Verifies an exported partition line by line, with no database: each record's hash over its exact
 * bytes, the links between them, the header's first and last seq and hash, and the checkpoint's
 * Ed25519 signature against `publicKeyPem`. An unsigned checkpoint passes only with `allowUnsigned`.
 */
export class PartitionFileVerifier {
  private lineNo = 0;
  private header: PartitionFileHeader | null = null;
  /** A month of leaf records (v4): its header, and where its records stand. */
  private leafHeader: LeafPartitionFileHeader | null = null;
  private expectedLeaf = 0;
  private firstSeq: number | null = null;
  private lastSeq: number | null = null;
  /** The chain's records among the leaves: where the next one is due, and the hash it chains from. */
  private chainAt: { seq: number; hash: string } | null = null;
  private trailer: PartitionFileTrailer | null = null;
  private checked = 0;
  private expectedSeq = 0;
  private prevHash = '';
  private firstHash: string | null = null;
  private failure: { line: number; reason: string } | null = null;
  private readonly digest = createHash('sha256');

  /** The records' leaves, on the left range the header names, while a log key is given. */
  private leaves: CompactRange | undefined;

  constructor(
    private readonly options: {
      publicKeyPem?: string | undefined;
      allowUnsigned?: boolean;
      /** The log's note verifier key: the records must be proven leaves of the tree it signed. */
      logKey?: string | undefined;
    } = {},
  ) {}

  /** Feeds the next line (without its newline). */
  line(text: string): void {
    if (this.failure !== null) return;
    this.lineNo += 1;
    if (this.trailer !== null) return this.fail('a line after the trailer');
    if (this.lineNo === 1) return this.readHeader(text);
    if (text.endsWith('"type":"trailer"}')) return this.readTrailer(text);
    this.digest.update(`${text}\n`);
    this.readRecord(text);
  }

  /** The verdict once every line was fed. */
  end(): PartitionFileVerification {
    if (this.failure === null && this.header === null && this.leafHeader === null) this.fail('an empty file');
    if (this.failure === null && this.trailer === null) this.fail('no trailer: the file is cut short');
    if (this.failure === null) this.checkTrailer();
    const checkpoint = this.trailer?.checkpoint;
    return {
      ok: this.failure === null,
      checked: this.checked,
      first_bad_line: this.failure?.line ?? null,
      reason: this.failure?.reason ?? null,
      header: this.leafHeader ?? this.header,
      checkpoint:
        checkpoint === undefined
          ? null
          : { id: checkpoint.id, seq: checkpoint.seq, hash: checkpoint.hash, key_id: checkpoint.key_id },
      signature_checked: this.failure === null && checkpoint?.signature != null,
      tree: this.failure === null ? this.treeChecked() : null,
    };
  }

  private treeChecked(): { tree_size: number; first_leaf_index: number } | null {
    const tree = this.leafHeader?.tree ?? (this.options.logKey !== undefined ? this.header?.tree : undefined);
    return tree === undefined ? null : { tree_size: tree.tree_size, first_leaf_index: tree.first_leaf_index };
  }

  private fail(reason: string, line = this.lineNo): void {
    this.failure ??= { line, reason };
  }

  private parseCanonical(text: string): Record<string, unknown> | undefined {
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      this.fail('not JSON');
      return undefined;
    }
    if (typeof value !== 'object' || value === null || Array.isArray(value)) {
      this.fail('not a JSON object');
      return undefined;
    }
    if (canonicalJson(value) !== text) {
      this.fail('not in canonical form (edited)');
      return undefined;
    }
    return value as Record<string, unknown>;
  }

  private readHeader(text: string): void {
    this.digest.update(`${text}\n`);
    const value = this.parseCanonical(text);
    if (value === undefined) return;
    if (value.type !== 'header' || !READABLE_FORMATS.includes(value.format as string))
      return this.fail(`not a ${READABLE_FORMATS.join(' or ')} header`);
    if (value.format === LEAF_PARTITION_FILE_FORMAT)
      return this.readLeafHeader(value as unknown as LeafPartitionFileHeader);
    const header = value as unknown as PartitionFileHeader;
    if (!Number.isSafeInteger(header.first_seq) || !Number.isSafeInteger(header.last_seq))
      return this.fail('a header without first_seq and last_seq');
    this.header = header;
    this.expectedSeq = header.first_seq;
    this.prevHash = header.prev_hash;
    if (this.options.logKey === undefined) return;
    if (header.tree === undefined)
      return this.fail('no Merkle tree evidence in the header (exported before it was covered?)');
    this.leaves = this.leftRange(header.tree);
  }

  private readLeafHeader(header: LeafPartitionFileHeader): void {
    const indexes = [header.first_leaf_index, header.last_leaf_index, header.first_seq, header.last_seq];
    if (!indexes.every(Number.isSafeInteger)) return this.fail('a header without its leaves and seqs');
    if (header.tree === undefined) return this.fail('no Merkle tree evidence in the header');
    this.leafHeader = header;
    this.expectedLeaf = header.first_leaf_index;
    if (header.chain !== undefined) this.chainAt = { seq: header.chain.from_seq, hash: header.chain.prev_hash };
    this.leaves = this.leftRange(header.tree);
  }

  private leftRange(tree: RangeEvidence): CompactRange | undefined {
    const left = CompactRange.fromHashes(
      tree.first_leaf_index,
      tree.left.map((hash) => Buffer.from(hash, 'base64')),
    );
    if (left === undefined) this.fail("the tree evidence's left range does not fit its first leaf index");
    return left;
  }

  /** A record of a month of leaf records: its fields and its place, and for a record of the chain its link. */
  private readLeafRecord(text: string): void {
    const record = this.parseCanonical(text);
    if (record === undefined) return;
    const { leaf_index, ...fields } = record;
    if (leaf_index !== this.expectedLeaf)
      return this.fail(`leaf ${String(leaf_index)} where ${this.expectedLeaf} was due`);
    const bytes = this.leafBytesOf(fields);
    if (bytes === undefined) return;
    const leaf = leafHash(bytes);
    this.leaves?.append(leaf);
    this.firstHash ??= leaf.toString('hex');
    this.prevHash = leaf.toString('hex');
    const seq = typeof fields.seq === 'number' ? fields.seq : null;
    this.firstSeq ??= seq;
    this.lastSeq = seq;
    this.expectedLeaf += 1;
    this.checked += 1;
  }

  /** A leaf record's bytes, or a chain record's once its hash and link check: the tree binds both the same way. */
  private leafBytesOf(fields: Record<string, unknown>): string | undefined {
    const at = `leaf ${this.expectedLeaf}`;
    const { seq, hash_scheme, prev_hash, hash, ...content } = fields;
    if (hash_scheme === HASH_SCHEME.leaf && Number.isSafeInteger(seq) && prev_hash === undefined && hash === undefined)
      return canonicalJson(content) ?? '{}';
    const chain = this.chainAt;
    if (chain === null) return void this.fail(`${at}: not a leaf record with its seq`);
    if (seq !== chain.seq) return void this.fail(`${at}: seq ${String(seq)} where ${chain.seq} of the chain was due`);
    const { hash: _hash, ...whole } = fields;
    const bytes = hash_scheme === undefined ? canonicalJson(whole) : canonicalJson(content);
    const record = hash_scheme === undefined ? whole : { ...content, seq, prev_hash, hash_scheme };
    if (prev_hash !== chain.hash || typeof hash !== 'string' || recordHash(record, bytes ?? '') !== hash)
      return void this.fail(`${at}: the record of the chain at seq ${chain.seq} does not chain or hash`);
    this.chainAt = { seq: chain.seq + 1, hash };
    return bytes;
  }

  private readRecord(text: string): void {
    if (this.leafHeader !== null) return this.readLeafRecord(text);
    const suffix = HASH_SUFFIX.exec(text);
    if (suffix === null) return this.fail('a record without its hash at the end');
    const hash = suffix[1]!;
    // The hash covers the record's exact bytes without the hash, as the appender serialised it, or
    // (a linked record) its place in the chain and the exact bytes of the rest.
    const body = `${text.slice(0, suffix.index)}}`;
    const record = this.parseCanonical(body);
    if (record === undefined) return;
    if (record.seq !== this.expectedSeq)
      return this.fail(`seq ${String(record.seq)} where ${this.expectedSeq} was due`);
    if (record.prev_hash !== this.prevHash) return this.fail(`seq ${this.expectedSeq}: prev_hash does not chain`);
    if (recordHash(record, body) !== hash)
      return this.fail(`seq ${this.expectedSeq}: the hash does not match the record`);
    this.leaves?.append(leafHash(leafBytes(record, body)));
    this.firstHash ??= hash;
    this.prevHash = hash;
    this.expectedSeq += 1;
    this.checked += 1;
  }

  /** Whether the records, between the evidence's subtrees, make the root of the checkpoint the log key signed. */
  private treeHolds(tree: RangeEvidence, logKey: string): boolean {
    const at = this.lineNo;
    const text = openNote(tree.checkpoint, logKey);
    const head = text === undefined ? undefined : parseCheckpoint(text);
    if (head === undefined || head.size !== tree.tree_size) {
      this.fail("the tree's checkpoint is not signed by the log key", at);
      return false;
    }
    const range = this.leaves!;
    const after = subtreesAfter(range.size, head.size);
    if (after.length !== tree.right.length) {
      this.fail("the tree evidence's right side does not fit the checkpoint's size", at);
      return false;
    }
    after.forEach(({ level }, i) => range.appendSubtree(level, Buffer.from(tree.right[i]!, 'base64')));
    if (!range.root().equals(head.root)) {
      this.fail('the records are not the leaves the signed tree holds there', at);
      return false;
    }
    return true;
  }

  private readTrailer(text: string): void {
    const value = this.parseCanonical(text);
    if (value === undefined) return;
    this.trailer = value as unknown as PartitionFileTrailer;
  }

  private checkTrailer(): void {
    if (this.leafHeader !== null) return this.checkLeafTrailer(this.leafHeader);
    const header = this.header!;
    const trailer = this.trailer!;
    const at = this.lineNo;
    if (trailer.lines_sha256 !== this.digest.digest('hex'))
      return this.fail('the lines before the trailer are not the ones it digests', at);
    if (this.checked !== header.rows || this.expectedSeq - 1 !== header.last_seq)
      return this.fail(`the records end at seq ${this.expectedSeq - 1}, the header says ${header.last_seq}`, at);
    if (this.firstHash !== header.first_hash || this.prevHash !== header.last_hash)
      return this.fail("the records' first or last hash is not the header's", at);
    if (this.leaves !== undefined && !this.treeHolds(header.tree!, this.options.logKey!)) return;
    const checkpoint = trailer.checkpoint;
    if (checkpoint?.seq !== header.last_seq || checkpoint.hash !== header.last_hash)
      return this.fail('the checkpoint is not at the last record', at);
    this.checkSignature(checkpoint, at);
  }

  /**
   * A month of leaf records holds when its records, between the evidence's subtrees, make the root of a
   * checkpoint signed by the log's key (given, or made from the public key and the note's origin) and the
   * seal at its last leaf is signed: the records are bound by the tree, the range's end by the seal.
   */
  private checkLeafTrailer(header: LeafPartitionFileHeader): void {
    const trailer = this.trailer!;
    const at = this.lineNo;
    if (trailer.lines_sha256 !== this.digest.digest('hex'))
      return this.fail('the lines before the trailer are not the ones it digests', at);
    if (this.checked !== header.rows || this.expectedLeaf - 1 !== header.last_leaf_index)
      return this.fail(
        `the records end at leaf ${this.expectedLeaf - 1}, the header says ${header.last_leaf_index}`,
        at,
      );
    if (this.firstHash !== header.first_hash || this.prevHash !== header.last_hash)
      return this.fail("the records' first or last leaf hash is not the header's", at);
    if (this.firstSeq !== header.first_seq || this.lastSeq !== header.last_seq)
      return this.fail("the records' first or last seq is not the header's", at);
    const chain = header.chain;
    if (chain !== undefined && (this.chainAt?.seq !== chain.to_seq + 1 || this.chainAt.hash !== chain.last_hash))
      return this.fail('the records of the chain do not end where the header says', at);
    const origin = header.tree.checkpoint.split('\n', 1)[0]!;
    const logKey =
      this.options.logKey ??
      (this.options.publicKeyPem === undefined
        ? undefined
        : verifierKeyOf(origin, createPublicKey(this.options.publicKeyPem)));
    if (logKey === undefined) return this.fail("the records are proven by the log's key: a key is needed", at);
    if (!this.treeHolds(header.tree, logKey)) return;
    const checkpoint = trailer.checkpoint;
    if (
      checkpoint?.leaf_index !== header.last_leaf_index ||
      checkpoint.seq !== header.last_seq ||
      checkpoint.hash !== header.last_hash
    )
      return this.fail('the seal is not at the last leaf', at);
    this.checkSignature(checkpoint, at);
  }

  private checkSignature(checkpoint: Checkpoint, at: number): void {
    if (checkpoint.signature === null || checkpoint.key_id === null) {
      if (!this.options.allowUnsigned) this.fail('the checkpoint is unsigned', at);
      return;
    }
    if (this.options.publicKeyPem === undefined)
      return this.fail('the checkpoint is signed: a public key is needed', at);
    const key = createPublicKey(this.options.publicKeyPem);
    if (checkpoint.key_id !== keyIdOf(key))
      return this.fail(`the checkpoint is signed by key ${checkpoint.key_id}, not this one`, at);
    const distrust = new CheckpointSigner({ verifyKeysPem: [this.options.publicKeyPem] }).distrust(checkpoint);
    if (distrust !== null) this.fail(`the checkpoint's signature does not verify (${distrust})`, at);
  }
}

/** The leaf bytes of an exported record: the canonical JSON its chain hash covers (a linked record's content). */
function leafBytes(record: Record<string, unknown>, body: string): string {
  if (record.hash_scheme === undefined) return body;
  const { seq: _seq, prev_hash: _prev, hash_scheme: _scheme, ...content } = record;
  return canonicalJson(content) ?? '{}';
}

/** A record's hash by its scheme, from its parsed fields and its canonical bytes without the hash. */
function recordHash(record: Record<string, unknown>, body: string): string | undefined {
  if (record.hash_scheme === undefined) return createHash('sha256').update(body).digest('hex');
  if (record.hash_scheme !== HASH_SCHEME.linked) return undefined;
  const { seq, prev_hash, hash_scheme: _scheme, ...content } = record;
  const contentHash = createHash('sha256')
    .update(canonicalJson(content) ?? '')
    .digest('hex');
  return linkHash(seq as number, prev_hash as string, contentHash);
}
