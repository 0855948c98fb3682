import { randomUUID } from 'node:crypto';
import { sql, type Transaction } from 'kysely';
import type { Logger } from 'pino';
import { BackgroundTask } from '../db/background-task.js';
import type { Database } from '../db/database.js';
import type { DB } from '../db/schema.js';
import { CodedError } from '../errors/coded-error.js';
import { GENESIS_HASH } from './audit-hash.js';
import { writeAuditEvents, type ChainHead } from './audit-repository.js';
import { verifyAuditChain, type ChainVerification } from './chain-verification.js';
import { checkpointsNewestFirst, findCheckpoint, insertCheckpoint, listCheckpoints } from './checkpoint-repository.js';
import type { Checkpoint, CheckpointSigner } from './checkpoint-signer.js';

export interface AuditCheckpointsOptions {
  database: Database;
  signer: CheckpointSigner;
  now: () => Date;
  logger: Logger;
  /** How often each replica checkpoints a chain that moved; 0 never (`TOOLGATE_AUDIT_CHECKPOINT_INTERVAL_SECONDS`). */
  intervalSeconds: number;
}

/** What `verifyFrom` answers: the walk after the checkpoint. */
export type VerificationFromCheckpoint = ChainVerification & { from_checkpoint: { id: string; seq: number } };

/** Periodic and on-demand checkpoints, and verification that starts after one (docs/design/audit-chain.md). */
export class AuditCheckpoints {
  private readonly task: BackgroundTask | undefined;

  constructor(private readonly options: AuditCheckpointsOptions) {
    const { intervalSeconds, logger } = options;
    this.task =
      intervalSeconds === 0
        ? undefined
        : new BackgroundTask({
            name: 'audit checkpoint',
            run: () => this.create('system.audit-checkpoint', { onlyIfMoved: true }),
            intervalMs: (failing) => (failing ? Math.min(intervalSeconds * 1000, 60_000) : intervalSeconds * 1000),
            logger,
          });
  }

  start(): void {
    this.task?.start();
  }

  async stop(): Promise<void> {
    await this.task?.stop();
  }

  /**
   * Verifies the chain from the newest trusted checkpoint to its head, then records a checkpoint of
   * that head (signed when a key is configured), so a checkpoint never vouches for a broken chain.
   * With `onlyIfMoved` (the periodic one), nothing is recorded when a checkpoint already holds the head.
   */
  async create(actor: string, options: { onlyIfMoved?: boolean } = {}): Promise<Checkpoint | null> {
    const { signer, now } = this.options;
    const db = this.options.database.control;
    const base = await this.newestTrusted();
    const from: ChainHead | undefined = base === undefined ? undefined : { seq: base.seq, hash: base.hash };
    const verified = await verifyAuditChain(db, undefined, undefined, from);
    if (!verified.ok) {
      throw new CodedError('audit_chain_broken', 'the audit chain does not verify; no checkpoint was recorded', {
        first_bad_seq: verified.first_bad_seq,
        ...(base === undefined ? {} : { from_checkpoint_id: base.id }),
      });
    }
    const head = verified.head ?? from ?? { seq: 0, hash: GENESIS_HASH };
    const checkpoint = signer.sign({
      id: `ckpt_${randomUUID()}`,
      seq: head.seq,
      hash: head.hash,
      at: now().toISOString(),
      created_by: actor,
    });
    const recorded = await db.transaction().execute(async (trx) => {
      if (options.onlyIfMoved) {
        // Replicas checkpoint on the same period: one records it, the others find it done.
        await sql`select pg_advisory_xact_lock(hashtext('toolgate.audit_checkpoint'))`.execute(trx);
        const done = await trx
          .selectFrom('audit_checkpoints')
          .select('id')
          .where('seq', '>=', String(head.seq))
          .executeTakeFirst();
        if (done !== undefined) return false;
      }
      await insertCheckpoint(trx, checkpoint);
      // A periodic checkpoint records no event of its own: it would move the head it just checkpointed.
      if (options.onlyIfMoved) return true;
      await recordCheckpointCreated(trx, checkpoint, actor, now());
      return true;
    });
    return recorded ? checkpoint : null;
  }

  list(query: { limit: number; before?: { seq: number; id: string } | undefined }) {
    return listCheckpoints(this.options.database.control, query);
  }

  /** Verifies only the rows after a checkpoint, once its signature is checked. */
  async verifyFrom(id: string, anchor?: ChainHead): Promise<VerificationFromCheckpoint> {
    const checkpoint = await findCheckpoint(this.options.database.control, id);
    // A seal of leaves vouches for the tree, which `/audit/verify` checks whole.
    if (checkpoint === undefined || checkpoint.leaf_index !== undefined)
      throw new CodedError('not_found', `no checkpoint of the chain ${id}`);
    const distrust = this.options.signer.distrust(checkpoint);
    if (distrust !== null) {
      throw new CodedError('checkpoint_untrusted', `checkpoint ${id} is not trusted: ${distrust.replace('_', ' ')}`, {
        checkpoint_id: id,
        reason: distrust,
      });
    }
    const verified = await verifyAuditChain(this.options.database.control, undefined, anchor, {
      seq: checkpoint.seq,
      hash: checkpoint.hash,
    });
    return { ...verified, from_checkpoint: { id: checkpoint.id, seq: checkpoint.seq } };
  }

  private async newestTrusted(): Promise<Checkpoint | undefined> {
    for await (const checkpoint of checkpointsNewestFirst(this.options.database.control)) {
      if (this.options.signer.distrust(checkpoint) === null) return checkpoint;
    }
    return undefined;
  }
}

/** The `audit.checkpoint_created` record of a checkpoint, in the transaction that inserts it. */
export async function recordCheckpointCreated(
  trx: Transaction<DB>,
  checkpoint: Checkpoint,
  actor: string,
  at: Date,
  details: Record<string, unknown> = {},
): Promise<void> {
  await writeAuditEvents(trx, [
    {
      event: {
        event_type: 'audit.checkpoint_created',
        actor,
        details: {
          checkpoint_id: checkpoint.id,
          seq: checkpoint.seq,
          hash: checkpoint.hash,
          key_id: checkpoint.key_id,
          ...details,
        },
      },
      occurredAt: at,
    },
  ]);
}
