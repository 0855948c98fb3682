import type { Kysely } from 'kysely';
import type { DB } from '../db/schema.js';
import type { AuditEventInput, AuditRecord } from './audit-event.js';
import { writeAuditEvents, type TimedAuditEvent } from './audit-repository.js';

interface Pending extends TimedAuditEvent {
  resolve: (record: AuditRecord) => void;
  reject: (error: unknown) => void;
}

const MAX_BATCH = 500;

/**
 * The append API the rest of toolgate uses. Events that arrive while a commit is in flight
 * are committed together in the next one (group commit); `append` resolves only once its
 * event is durable, and rejects if the commit failed, so a caller never proceeds unaudited.
 */
export class AuditLog {
  private queue: Pending[] = [];
  private flushing: Promise<void> | undefined;

  constructor(
    private readonly db: Kysely<DB>,
    private readonly now: () => Date = () => new Date(),
    private readonly onCommit: (batchSize: number) => void = () => undefined,
  ) {}

  append(event: AuditEventInput): Promise<AuditRecord> {
    return new Promise((resolve, reject) => {
      this.queue.push({ event, occurredAt: this.now(), resolve, reject });
      this.flushing ??= this.flush().finally(() => {
        this.flushing = undefined;
      });
    });
  }

  appendMany(events: AuditEventInput[]): Promise<AuditRecord[]> {
    return Promise.all(events.map((event) => this.append(event)));
  }

  /** Resolves when everything appended so far has been committed or has failed. */
  async drain(): Promise<void> {
    while (this.flushing) await this.flushing;
  }

  private async flush(): Promise<void> {
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, MAX_BATCH);
      try {
        const records = await this.db.transaction().execute((trx) => writeAuditEvents(trx, batch));
        this.onCommit(batch.length);
        batch.forEach((pending, i) => pending.resolve(records[i]!));
      } catch (error) {
        for (const pending of batch) pending.reject(error);
      }
    }
  }
}
