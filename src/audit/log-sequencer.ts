import type { Logger } from 'pino';
import { BackgroundTask } from '../db/background-task.js';
import type { Database } from '../db/database.js';
import { CLOSE_STEP_WAIT_MS, waitAtMost } from '../db/wait-at-most.js';
import { readLeafRecords } from './hashed-rows.js';
import { leafHash, rootOf } from './merkle.js';
import { edgeTiles, tileKey, TreeEdge, type Tile } from './merkle-tiles.js';
import { checkpointText, type NoteSigner } from './signed-note.js';
import {
  findTreeCheckpoint,
  insertTreeCheckpoint,
  lockTreeState,
  readChainEnd,
  readTiles,
  takeUnsequenced,
  releaseSequencerLease,
  renewSequencerLease,
  writeSequenced,
} from './tree-repository.js';

export interface LogSequencerOptions {
  database: Database;
  signer: NoteSigner;
  /** This replica's id: the lease's holder. */
  replicaId: string;
  /** How often a round runs (`TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS`). */
  intervalMs: number;
  logger: Logger;
  /** Told, for each record sequenced, the seconds since it was written. */
  onSequenced?: (delaysSeconds: number[]) => void;
  /** At most this many records a transaction; a round goes on while it finds as many. */
  batchSize?: number;
}

/** How long the lease holds without a round: another replica takes over after it. */
const LEASE_MS = 3_000;
/** Records a transaction sequences at most, unless the options say otherwise. */
const BATCH_SIZE = 10_000;
/** A round catching up stops after this long, so that its lease and the next round stay timely. */
const ROUND_MS = 1_000;

/**
 * Sequences committed records into the Merkle tree: one replica at a time (the lease in `audit_tree_state`),
 * every `intervalMs`, it numbers the committed records not sequenced yet (the chain's in seq order, then leaf
 * records from their queue), extends the tiles and publishes a signed checkpoint, in one transaction.
 * docs/design/audit-chain.md#sequencing
 */
export class LogSequencer {
  private readonly task: BackgroundTask;
  /** The right edge of the tree as this replica last wrote it; reloaded when another replica moved it. */
  private edge: TreeEdge | undefined;

  constructor(private readonly options: LogSequencerOptions) {
    this.task = new BackgroundTask({
      name: 'audit sequencer',
      run: () => this.round(),
      intervalMs: () => options.intervalMs,
      logger: options.logger,
    });
  }

  start(): void {
    this.task.start();
  }

  async stop(): Promise<void> {
    await this.task.stop();
    await waitAtMost(
      releaseSequencerLease(this.options.database.control, this.options.replicaId).catch(() => undefined),
      CLOSE_STEP_WAIT_MS,
    );
  }

  /** Sequences what has committed, as long as it finds full batches (at most about a second). */
  async round(): Promise<number> {
    const started = performance.now();
    let total = 0;
    for (;;) {
      const sequenced = await this.step();
      total += sequenced ?? 0;
      if (sequenced === undefined || sequenced < (this.options.batchSize ?? BATCH_SIZE)) return total;
      if (performance.now() - started > ROUND_MS) return total;
    }
  }

  /** One transaction: the records sequenced, or undefined when another replica sequences. */
  private async step(): Promise<number | undefined> {
    const { database, signer, replicaId } = this.options;
    const limit = this.options.batchSize ?? BATCH_SIZE;
    const delays: number[] = [];
    const sequenced = await database.control
      .transaction()
      .execute(async (trx) => {
        const state = await lockTreeState(trx, replicaId);
        if (state === undefined || state.leasedElsewhere) {
          this.edge = undefined;
          return undefined;
        }
        await renewSequencerLease(trx, replicaId, LEASE_MS);
        const chain = await readChainEnd(trx);
        // The chain's records commit in seq order, so those after the last sequenced come next; once it is
        // closed and sequenced to its end, leaf records (committing in any order) come through their queue.
        const fromQueue = chain.closed && state.lastSeq >= chain.seq;
        const records = fromQueue
          ? await takeUnsequenced(trx, limit).then((seqs) => (seqs.length === 0 ? [] : readLeafRecords(trx, { seqs })))
          : await readLeafRecords(trx, {
              afterSeq: state.lastSeq,
              ...(chain.closed ? { throughSeq: chain.seq } : {}),
              limit,
            });
        if (records.length === 0) {
          // The first round of a log publishes the checkpoint of its empty tree.
          if ((await findTreeCheckpoint(trx, state.treeSize)) === undefined) {
            const note = signer.sign(
              checkpointText({ origin: signer.name, size: state.treeSize, root: state.rootHash }),
            );
            await insertTreeCheckpoint(trx, state.treeSize, state.rootHash, note);
          }
          return 0;
        }
        const edge = await this.edgeOf(trx, state.treeSize);
        const tiles: Tile[] = edge.append(records.map((record) => leafHash(record.canonical)));
        const rootHash = rootOf(edge.reader(), edge.size);
        const note = signer.sign(checkpointText({ origin: signer.name, size: edge.size, root: rootHash }));
        await writeSequenced(trx, {
          firstIndex: state.treeSize,
          leaves: records.map((record) => ({ seq: record.seq, eventId: record.eventId })),
          tiles,
          treeSize: edge.size,
          // `last_seq` follows the chain's records only: leaf records are found through their queue.
          lastSeq: fromQueue ? state.lastSeq : records[records.length - 1]!.seq,
          rootHash,
          note,
        });
        const now = Date.now();
        for (const record of records)
          if (record.occurredAt !== null) delays.push((now - Date.parse(record.occurredAt)) / 1000);
        return records.length;
      })
      .catch((error: unknown) => {
        // What was appended to the edge in memory did not commit.
        this.edge = undefined;
        throw error;
      });
    if (delays.length > 0) this.options.onSequenced?.(delays);
    return sequenced;
  }

  private async edgeOf(trx: Parameters<typeof readTiles>[0], size: number): Promise<TreeEdge> {
    if (this.edge?.size === size) return this.edge;
    const wanted = edgeTiles(size);
    const stored = await readTiles(trx, wanted);
    const tiles = wanted.flatMap(({ level, index }) => {
      const hashes = stored.get(tileKey(level, index));
      return hashes === undefined ? [] : [{ level, index, hashes }];
    });
    this.edge = new TreeEdge(size, tiles);
    return this.edge;
  }
}
