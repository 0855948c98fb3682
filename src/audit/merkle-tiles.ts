import { nodeHash, type Hash, type NodeReader } from './merkle.js';

/**
 * The tree stored as C2SP tlog-tiles: a tile of level L, index N holds the hashes of the nodes at tree level
 * 8·L numbered N·256 … N·256+width−1, concatenated. Any complete subtree's hash is one tile's slice, reduced.
 */
export const TILE_HEIGHT = 8;
export const TILE_WIDTH = 2 ** TILE_HEIGHT;
const HASH_SIZE = 32;

export interface Tile {
  level: number;
  index: number;
  /** `width` hashes of 32 bytes. */
  hashes: Buffer;
}

export function tileKey(level: number, index: number): string {
  return `${level}/${index}`;
}

/** Which tile holds what node (level, index) reduces from, and where in it. */
export function tileOf(level: number, index: number): { level: number; index: number; offset: number; count: number } {
  const count = 2 ** (level % TILE_HEIGHT);
  const first = index * count;
  return {
    level: Math.floor(level / TILE_HEIGHT),
    index: Math.floor(first / TILE_WIDTH),
    offset: first % TILE_WIDTH,
    count,
  };
}

/** Reads nodes from the tiles given, keyed by `tileKey`. */
export function tileReader(tiles: Map<string, Buffer>): NodeReader {
  return (level, index) => {
    const at = tileOf(level, index);
    const tile = tiles.get(tileKey(at.level, at.index));
    if (tile === undefined || tile.length < (at.offset + at.count) * HASH_SIZE)
      throw new Error(`the audit tree has no node ${level}/${index}`);
    const hashes: Hash[] = [];
    for (let i = 0; i < at.count; i += 1) {
      const start = (at.offset + i) * HASH_SIZE;
      hashes.push(tile.subarray(start, start + HASH_SIZE));
    }
    return Buffer.from(reduce(hashes));
  };
}

/** The root of a complete subtree from its 2^k hashes of one level. */
function reduce(hashes: Hash[]): Hash {
  let level = hashes;
  while (level.length > 1) {
    const next: Hash[] = [];
    for (let i = 0; i < level.length; i += 2) next.push(nodeHash(level[i]!, level[i + 1]!));
    level = next;
  }
  return level[0]!;
}

/**
 * The tiles a computation over the tree reads, found by running it once over placeholder hashes (the RFC's
 * algorithms choose nodes by index alone), so that they can be fetched in one query before it runs for real.
 */
export function tilesRead(run: (read: NodeReader) => unknown): Array<{ level: number; index: number }> {
  const keys = new Map<string, { level: number; index: number }>();
  const placeholder = Buffer.alloc(HASH_SIZE);
  run((level, index) => {
    const at = tileOf(level, index);
    keys.set(tileKey(at.level, at.index), { level: at.level, index: at.index });
    return placeholder;
  });
  return [...keys.values()];
}

/** The last tile of each level for a tree of `size`: what extending it and computing its root read. */
export function edgeTiles(size: number): Array<{ level: number; index: number; width: number }> {
  const tiles: Array<{ level: number; index: number; width: number }> = [];
  for (let level = 0; ; level += 1) {
    const count = Math.floor(size / TILE_WIDTH ** level);
    if (count === 0) return tiles;
    const index = Math.floor((count - 1) / TILE_WIDTH);
    tiles.push({ level, index, width: count - index * TILE_WIDTH });
  }
}

/**
 * The right edge of the stored tree, kept by the sequencer: the last tile of each level. Appending leaves
 * fills them (a full tile's root goes up a level) and says which tiles changed, to be written.
 */
export class TreeEdge {
  private readonly last: Array<{ index: number; hashes: Hash[] }> = [];

  constructor(
    public size: number,
    tiles: Tile[],
  ) {
    for (const { level, index, width } of edgeTiles(size)) {
      const tile = tiles.find((t) => t.level === level && t.index === index);
      if (tile === undefined || tile.hashes.length < width * HASH_SIZE)
        throw new Error(`the audit tree of ${size} leaves lacks its tile ${level}/${index}`);
      const hashes: Hash[] = [];
      for (let i = 0; i < width; i += 1)
        hashes.push(Buffer.from(tile.hashes.subarray(i * HASH_SIZE, (i + 1) * HASH_SIZE)));
      this.last[level] = { index, hashes };
    }
  }

  /** Appends leaf hashes; answers the tiles that changed, as they now stand. */
  append(leaves: Hash[]): Tile[] {
    const changed = new Map<string, { level: number; index: number; hashes: Hash[] }>();
    for (const leaf of leaves) {
      this.push(0, leaf, changed);
      this.size += 1;
    }
    return [...changed.values()].map(({ level, index, hashes }) => ({ level, index, hashes: Buffer.concat(hashes) }));
  }

  private push(
    level: number,
    hash: Hash,
    changed: Map<string, { level: number; index: number; hashes: Hash[] }>,
  ): void {
    let tile = this.last[level];
    if (tile === undefined) tile = this.last[level] = { index: 0, hashes: [] };
    else if (tile.hashes.length === TILE_WIDTH) tile = this.last[level] = { index: tile.index + 1, hashes: [] };
    tile.hashes.push(hash);
    changed.set(tileKey(level, tile.index), { level, ...tile });
    if (tile.hashes.length === TILE_WIDTH) this.push(level + 1, reduce(tile.hashes), changed);
  }

  /** Reads the nodes the edge holds: those of the tree's root and of its extension. */
  reader(): NodeReader {
    const tiles = new Map<string, Buffer>();
    this.last.forEach((tile, level) => tiles.set(tileKey(level, tile.index), Buffer.concat(tile.hashes)));
    return tileReader(tiles);
  }
}
