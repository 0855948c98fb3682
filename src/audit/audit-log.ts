import type { Kysely } from 'kysely';
import { GroupCommit } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import type { AuditEventInput, AuditRecord } from './audit-event.js';
import { writeAuditEvents, type TimedAuditEvent } from './audit-repository.js';

/**
 * The append API the rest of toolgate uses. Events that arrive while a commit is in flight
 * are committed together in the next one (group commit); `append` resolves only once its
 * event is durable, and rejects if the commit failed, so a caller never proceeds unaudited.
 */
export class AuditLog {
  private readonly batches: GroupCommit<TimedAuditEvent, AuditRecord>;

  constructor(
    db: Kysely<DB>,
    private readonly now: () => Date = () => new Date(),
    onCommit: (batchSize: number) => void = () => undefined,
  ) {
    this.batches = new GroupCommit(async (batch) => {
      const records = await db.transaction().execute((trx) => writeAuditEvents(trx, batch));
      onCommit(batch.length);
      return records;
    });
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
