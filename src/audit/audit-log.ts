import type { Kysely } from 'kysely';
import { GroupCommit } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import type { AuditEventInput, AuditRecord } from './audit-event.js';
import { appendIfHead, readChainHead, writeAuditEvents, type ChainHead, type TimedAuditEvent } from './audit-repository.js';

/**
 * The append API the rest of toolgate uses. Events that arrive while a commit is in flight
 * are committed together in the next one (group commit); `append` resolves only once its
 * event is durable, and rejects if the commit failed, so a caller never proceeds unaudited.
 */
export class AuditLog {
  private readonly batches: GroupCommit<TimedAuditEvent, AuditRecord>;
  private head: ChainHead | undefined;

  constructor(
    db: Kysely<DB>,
    private readonly now: () => Date = () => new Date(),
    onCommit: (batchSize: number) => void = () => undefined,
  ) {
    this.batches = new GroupCommit(async (batch) => {
      const records = await this.commit(db, batch);
      onCommit(batch.length);
      return records;
    });
  }

  /**
   * Appends against the head this replica last wrote, in one statement; when another writer
   * moved the head meanwhile, reads it again and retries, and under heavy contention falls
   * back to the locking transaction.
   */
  private async commit(db: Kysely<DB>, batch: TimedAuditEvent[]): Promise<AuditRecord[]> {
    for (let attempt = 0; attempt < 3; attempt += 1) {
      const head = this.head ?? (await readChainHead(db));
      const appended = await appendIfHead(db, head, batch);
      if (appended) {
        this.head = appended.last;
        return appended.records;
      }
      this.head = undefined;
    }
    const records = await db.transaction().execute((trx) => writeAuditEvents(trx, batch));
    const last = records[records.length - 1];
    this.head = last ? { seq: last.seq, hash: last.hash } : undefined;
    return records;
  }

  append(event: AuditEventInput): Promise<AuditRecord> {
    return this.batches.submit({ event, occurredAt: this.now() });
  }

  appendMany(events: AuditEventInput[]): Promise<AuditRecord[]> {
    return Promise.all(events.map((event) => this.append(event)));
  }

  /** Resolves when everything appended so far has been committed or has failed. */
  drain(): Promise<void> {
    return this.batches.drain();
  }
}
