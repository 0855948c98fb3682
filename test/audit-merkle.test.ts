import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  CompactRange,
  consistencyProof,
  inclusionProof,
  leafHash,
  rootOf,
  subtreesAfter,
  verifyConsistency,
  verifyInclusion,
  type NodeReader,
} from '../src/audit/merkle.js';
import { tileReader, tileKey, tilesRead, TreeEdge, type Tile } from '../src/audit/merkle-tiles.js';
import { checkpointText, NoteSigner, openNote, parseCheckpoint } from '../src/audit/signed-note.js';
import vectors from './fixtures/rfc6962-vectors.json' with { type: 'json' };

const b64 = (text: string) => Buffer.from(text, 'base64');
const leaves = vectors.leafInputsHex.map((hex) => leafHash(Buffer.from(hex, 'hex')));

/** A tree of these leaf hashes as the sequencer stores it: tiles, filled through the right edge. */
function tiled(hashes: Buffer[], step = 3): { read: NodeReader; tiles: Map<string, Buffer> } {
  const tiles = new Map<string, Buffer>();
  let edge = new TreeEdge(0, []);
  for (let at = 0; at < hashes.length; at += step) {
    for (const tile of edge.append(hashes.slice(at, at + step)))
      tiles.set(tileKey(tile.level, tile.index), tile.hashes);
    // A new sequencer picks the edge up from the stored tiles.
    const stored: Tile[] = [...tiles].map(([key, bytes]) => {
      const [level, index] = key.split('/').map(Number);
      return { level: level!, index: index!, hashes: bytes };
    });
    edge = new TreeEdge(edge.size, stored);
  }
  return { read: tileReader(tiles), tiles };
}

/** The tree of RFC 9162 §2.1.1, straight from its definition: what the tiles must agree with. */
function mth(hashes: Buffer[]): Buffer {
  if (hashes.length === 0) return createHash('sha256').digest();
  if (hashes.length === 1) return hashes[0]!;
  let k = 1;
  while (k * 2 < hashes.length) k *= 2;
  return createHash('sha256')
    .update(Buffer.from([1]))
    .update(mth(hashes.slice(0, k)))
    .update(mth(hashes.slice(k)))
    .digest();
}

describe('the Merkle tree (RFC 9162 §2.1)', () => {
  it('has the reference roots of RFC 6962 test data for every size, stored as tiles', () => {
    const { read } = tiled(leaves, 1);
    vectors.rootHashesHex.forEach((hex, size) => expect(rootOf(read, size).toString('hex')).toBe(hex));
  });

  it('gives the reference inclusion proofs', () => {
    const { read } = tiled(leaves);
    for (const v of vectors.inclusion) {
      const proof = inclusionProof(read, v.leafIdx, v.treeSize).map((h) => h.toString('base64'));
      expect(proof).toEqual(v.proof ?? []);
      expect(leaves[v.leafIdx]!.toString('base64')).toBe(v.leafHash);
      expect(verifyInclusion(v.leafIdx, v.treeSize, b64(v.leafHash), (v.proof ?? []).map(b64), b64(v.root))).toBe(true);
    }
  });

  it('gives the reference consistency proofs', () => {
    const { read } = tiled(leaves);
    for (const v of vectors.consistency) {
      const proof = consistencyProof(read, v.size1, v.size2).map((h) => h.toString('base64'));
      expect(proof).toEqual(v.proof ?? []);
      expect(verifyConsistency(v.size1, v.size2, b64(v.root1), b64(v.root2), (v.proof ?? []).map(b64))).toBe(true);
    }
  });

  it('refuses proofs that are altered, truncated or for another leaf', () => {
    const { read } = tiled(leaves);
    const root = rootOf(read, 7);
    const proof = inclusionProof(read, 5, 7);
    expect(verifyInclusion(5, 7, leaves[5]!, proof, root)).toBe(true);
    expect(verifyInclusion(4, 7, leaves[5]!, proof, root)).toBe(false);
    expect(verifyInclusion(5, 7, leaves[5]!, proof.slice(1), root)).toBe(false);
    const flipped = proof.map((h, i) => (i === 1 ? Buffer.from(h.map((byte, j) => (j === 0 ? byte ^ 1 : byte))) : h));
    expect(verifyInclusion(5, 7, leaves[5]!, flipped, root)).toBe(false);
    const consistency = consistencyProof(read, 3, 7);
    expect(verifyConsistency(3, 7, rootOf(read, 3), root, consistency)).toBe(true);
    expect(verifyConsistency(3, 7, rootOf(read, 4), root, consistency)).toBe(false);
    expect(verifyConsistency(4, 7, rootOf(read, 4), root, [])).toBe(false);
  });

  it('keeps large trees across many tiles consistent with the definition', () => {
    const many = Array.from({ length: 70_000 }, (_, i) => leafHash(`leaf ${i}`));
    const { read, tiles } = tiled(many, 4_099);
    // Level 0 holds 274 tiles (the last partial), level 1 two, level 2 one.
    expect(tiles.size).toBe(274 + 2 + 1);
    for (const size of [1, 255, 256, 257, 65_536, 65_537, 69_999, 70_000]) {
      const root = rootOf(read, size);
      if (size <= 2_000 || size === 70_000 || size === 65_536) expect(root.equals(mth(many.slice(0, size)))).toBe(true);
      const index = size - 1 - (size >> 1);
      expect(verifyInclusion(index, size, many[index]!, inclusionProof(read, index, size), root)).toBe(true);
      if (size >= 300)
        expect(verifyConsistency(300, size, rootOf(read, 300), root, consistencyProof(read, 300, size))).toBe(true);
      else expect(() => consistencyProof(read, 300, size)).toThrow(RangeError);
    }
    const compact = new CompactRange();
    many.forEach((leaf) => compact.append(leaf));
    expect(compact.root().equals(rootOf(read, 70_000))).toBe(true);
    expect(CompactRange.of(read, 65_537).root().equals(rootOf(read, 65_537))).toBe(true);
  });

  it('proves a range of leaves from the subtrees before and after it, as an export carries them', () => {
    const many = Array.from({ length: 5_000 }, (_, i) => leafHash(`leaf ${i}`));
    const { read } = tiled(many, 777);
    for (const [first, last, size] of [
      [0, 2, 9],
      [3, 6, 9],
      [256, 511, 5_000],
      [1_000, 1_234, 4_321],
      [4_999, 4_999, 5_000],
    ] as const) {
      const range = CompactRange.fromHashes(first, CompactRange.of(read, first).hashes())!;
      for (let i = first; i <= last; i += 1) range.append(many[i]!);
      for (const { level, index } of subtreesAfter(last + 1, size)) range.appendSubtree(level, read(level, index));
      expect(range.size).toBe(size);
      expect(range.root().equals(rootOf(read, size))).toBe(true);
    }
    expect(CompactRange.fromHashes(6, [leaves[0]!])).toBeUndefined();
    expect(() => new CompactRange(3).appendSubtree(1, leaves[0]!)).toThrow(RangeError);
  });

  it('reads each proof from a few tiles, named before they are fetched', () => {
    const many = Array.from({ length: 70_000 }, (_, i) => leafHash(`leaf ${i}`));
    const { tiles } = tiled(many, 10_000);
    const needed = tilesRead((read) => inclusionProof(read, 12_345, 70_000));
    expect(needed.length).toBeLessThanOrEqual(6);
    const only = new Map(needed.map(({ level, index }) => [tileKey(level, index), tiles.get(tileKey(level, index))!]));
    const root = rootOf(tileReader(tiles), 70_000);
    expect(verifyInclusion(12_345, 70_000, many[12_345]!, inclusionProof(tileReader(only), 12_345, 70_000), root)).toBe(
      true,
    );
  });
});

describe('signed notes (C2SP signed-note, golang.org/x/mod/sumdb/note)', () => {
  const note = vectors.signedNote;

  it("signs as Go's note package does, byte for byte, and names the same verifier key", () => {
    const signer = NoteSigner.fromNoteKey(note.privateKey);
    expect(signer.verifierKey).toBe(note.verifierKey);
    expect(signer.sign(note.text)).toBe(note.signed);
  });

  it('opens a note only with a valid signature of the named key', () => {
    expect(openNote(note.signed, note.verifierKey)).toBe(note.text);
    expect(openNote(note.signed.replace('problem,', 'problem;'), note.verifierKey)).toBeUndefined();
    expect(openNote(note.signed.replace('x08go', 'x08gp'), note.verifierKey)).toBeUndefined();
    const other = note.verifierKey.replace('PeterNeumann', 'PeterNeuman');
    expect(openNote(note.signed, other)).toBeUndefined();
  });

  it('writes and reads tlog-checkpoint bodies', () => {
    const head = { origin: 'toolgate.example/audit', size: 8, root: Buffer.from(vectors.rootHashesHex[8]!, 'hex') };
    const text = checkpointText(head);
    expect(text).toBe(`toolgate.example/audit\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n`);
    expect(parseCheckpoint(text)).toEqual(head);
    expect(
      parseCheckpoint('toolgate.example/audit\n08\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n'),
    ).toBeUndefined();
  });
});
