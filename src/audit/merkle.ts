import { createHash, hash } from 'node:crypto';

/**
 * The Merkle tree of RFC 9162 §2.1 (the same as RFC 6962's): leaves hashed as SHA-256(0x00 ‖ leaf),
 * inner nodes as SHA-256(0x01 ‖ left ‖ right). Node (level, index) is the root of the complete subtree
 * over leaves [index·2^level, (index+1)·2^level). docs/design/audit-chain.md
 */
export type Hash = Buffer;

const LEAF = Buffer.from([0]);
/** 0x01 ‖ left ‖ right, filled for each node: one-shot hashing of one buffer is about twice a hasher's speed. */
const NODE_INPUT = Buffer.alloc(65, 1);

export function leafHash(leaf: string | Buffer): Hash {
  // U+0000 is the one byte 0x00 in UTF-8.
  return typeof leaf === 'string'
    ? hash('sha256', `\u0000${leaf}`, 'buffer')
    : hash('sha256', Buffer.concat([LEAF, leaf]), 'buffer');
}

export function nodeHash(left: Hash, right: Hash): Hash {
  if (left.length !== 32 || right.length !== 32) throw new RangeError('a tree node hashes two SHA-256s');
  left.copy(NODE_INPUT, 1);
  right.copy(NODE_INPUT, 33);
  return hash('sha256', NODE_INPUT, 'buffer');
}

export const EMPTY_ROOT: Hash = createHash('sha256').digest();

/** The hash of a complete subtree, from wherever the caller keeps them. */
export type NodeReader = (level: number, index: number) => Hash;

/** The largest power of two smaller than n (n ≥ 2). */
function split(n: number): number {
  let k = 1;
  while (k * 2 < n) k *= 2;
  return k;
}

/** log2 of n when n is a power of two; -1 otherwise. */
function levelOf(n: number): number {
  let level = 0;
  for (let size = 1; size <= n; size *= 2, level += 1) if (size === n) return level;
  return -1;
}

/**
 * MTH(D[lo:hi]). Every range the RFC's recursions ask for starts at a multiple of its largest power of
 * two, so a complete one is a stored node.
 */
export function rangeHash(read: NodeReader, lo: number, hi: number): Hash {
  const n = hi - lo;
  if (n === 0) return EMPTY_ROOT;
  const level = levelOf(n);
  if (level >= 0 && lo % n === 0) return read(level, lo / n);
  const k = split(n);
  return nodeHash(rangeHash(read, lo, lo + k), rangeHash(read, lo + k, hi));
}

export function rootOf(read: NodeReader, size: number): Hash {
  return rangeHash(read, 0, size);
}

/** PATH(m, D[lo:hi]) of RFC 9162 §2.1.3.1, leaf side first. */
function path(read: NodeReader, m: number, lo: number, hi: number): Hash[] {
  const n = hi - lo;
  if (n <= 1) return [];
  const k = split(n);
  return m < k
    ? [...path(read, m, lo, lo + k), rangeHash(read, lo + k, hi)]
    : [...path(read, m - k, lo + k, hi), rangeHash(read, lo, lo + k)];
}

export function inclusionProof(read: NodeReader, index: number, size: number): Hash[] {
  if (!(index >= 0 && index < size)) throw new RangeError(`leaf ${index} is not in a tree of ${size}`);
  return path(read, index, 0, size);
}

/** SUBPROOF(m, D[lo:hi], b) of RFC 9162 §2.1.4.1. */
function subproof(read: NodeReader, m: number, lo: number, hi: number, whole: boolean): Hash[] {
  const n = hi - lo;
  if (m === n) return whole ? [] : [rangeHash(read, lo, hi)];
  const k = split(n);
  return m <= k
    ? [...subproof(read, m, lo, lo + k, whole), rangeHash(read, lo + k, hi)]
    : [...subproof(read, m - k, lo + k, hi, false), rangeHash(read, lo, lo + k)];
}

export function consistencyProof(read: NodeReader, first: number, second: number): Hash[] {
  if (!(first >= 0 && first <= second)) throw new RangeError(`no consistency proof from ${first} to ${second}`);
  if (first === 0 || first === second) return [];
  return subproof(read, first, 0, second, true);
}

/** The root an inclusion proof leads to (RFC 9162 §2.1.3.2); undefined for a proof of the wrong shape. */
export function rootFromInclusion(index: number, size: number, leaf: Hash, proof: Hash[]): Hash | undefined {
  if (!(index >= 0 && index < size)) return undefined;
  let fn = index;
  let sn = size - 1;
  let r = leaf;
  for (const p of proof) {
    if (sn === 0) return undefined;
    if (fn % 2 === 1 || fn === sn) {
      r = nodeHash(p, r);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      }
    } else {
      r = nodeHash(r, p);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  return sn === 0 ? r : undefined;
}

export function verifyInclusion(index: number, size: number, leaf: Hash, proof: Hash[], root: Hash): boolean {
  return rootFromInclusion(index, size, leaf, proof)?.equals(root) ?? false;
}

/** Whether a consistency proof shows the tree of `first` is a prefix of that of `second` (RFC 9162 §2.1.4.2). */
export function verifyConsistency(
  first: number,
  second: number,
  firstRoot: Hash,
  secondRoot: Hash,
  proof: Hash[],
): boolean {
  if (first > second || first < 0) return false;
  if (first === second) return proof.length === 0 && firstRoot.equals(secondRoot);
  if (first === 0) return proof.length === 0;
  if (proof.length === 0) return false;
  const nodes = isPowerOfTwo(first) ? [firstRoot, ...proof] : proof;
  if (nodes.length === 0) return false;
  let fn = first - 1;
  let sn = second - 1;
  while (fn % 2 === 1) {
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  let fr = nodes[0]!;
  let sr = nodes[0]!;
  for (const c of nodes.slice(1)) {
    if (sn === 0) return false;
    if (fn % 2 === 1 || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      }
    } else {
      sr = nodeHash(sr, c);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  return sn === 0 && fr.equals(firstRoot) && sr.equals(secondRoot);
}

/** The complete subtrees that follow leaf `from` up to `size`, in order: what extends a range ending there to the whole tree. */
export function subtreesAfter(from: number, size: number): Array<{ level: number; index: number }> {
  const subtrees: Array<{ level: number; index: number }> = [];
  for (let at = from; at < size;) {
    let level = 0;
    while (at % 2 ** (level + 1) === 0 && at + 2 ** (level + 1) <= size) level += 1;
    subtrees.push({ level, index: at / 2 ** level });
    at += 2 ** level;
  }
  return subtrees;
}

function isPowerOfTwo(n: number): boolean {
  return levelOf(n) >= 0;
}

/**
 * A tree's right edge as the roots of its complete subtrees, largest first (a "compact range" from 0):
 * enough to extend it leaf by leaf and to compute its root, in O(log n) memory.
 */
export class CompactRange {
  private readonly nodes: Array<{ level: number; hash: Hash }>;

  constructor(
    public size = 0,
    nodes: Array<{ level: number; hash: Hash }> = [],
  ) {
    this.nodes = [...nodes];
  }

  /** The right edge of a tree of `size` leaves, from its stored nodes. */
  static of(read: NodeReader, size: number): CompactRange {
    const nodes: Array<{ level: number; hash: Hash }> = [];
    let lo = 0;
    for (let level = 52; level >= 0; level -= 1) {
      const width = 2 ** level;
      if (lo + width <= size) {
        nodes.push({ level, hash: read(level, lo / width) });
        lo += width;
      }
    }
    return new CompactRange(size, nodes);
  }

  /** Appends a leaf hash; calls `completed` for each complete subtree this finishes (level ≥ 1). */
  append(leaf: Hash, completed?: (level: number, index: number, hash: Hash) => void): void {
    this.appendSubtree(0, leaf, completed);
  }

  /** Appends the root of a complete subtree of 2^level leaves; the range's size must be a multiple of 2^level. */
  appendSubtree(level: number, hash: Hash, completed?: (level: number, index: number, hash: Hash) => void): void {
    const width = 2 ** level;
    if (this.size % width !== 0) throw new RangeError(`a subtree of ${width} leaves cannot follow ${this.size}`);
    let node = { level, hash };
    let index = this.size / width;
    while (this.nodes.length > 0 && this.nodes[this.nodes.length - 1]!.level === node.level) {
      const left = this.nodes.pop()!;
      index = Math.floor(index / 2);
      node = { level: node.level + 1, hash: nodeHash(left.hash, node.hash) };
      completed?.(node.level, index, node.hash);
    }
    this.nodes.push(node);
    this.size += width;
  }

  /** The hashes of the range's complete subtrees, largest first. */
  hashes(): Hash[] {
    return this.nodes.map((node) => node.hash);
  }

  /** The range [0, size) from the hashes `hashes()` gave: their levels follow from the size. */
  static fromHashes(size: number, hashes: Hash[]): CompactRange | undefined {
    const levels: number[] = [];
    for (let level = 52; level >= 0; level -= 1) if (Math.floor(size / 2 ** level) % 2 === 1) levels.push(level);
    if (levels.length !== hashes.length) return undefined;
    return new CompactRange(
      size,
      levels.map((level, i) => ({ level, hash: hashes[i]! })),
    );
  }

  root(): Hash {
    if (this.nodes.length === 0) return EMPTY_ROOT;
    let hash = this.nodes[this.nodes.length - 1]!.hash;
    for (let i = this.nodes.length - 2; i >= 0; i -= 1) hash = nodeHash(this.nodes[i]!.hash, hash);
    return hash;
  }
}
