import type { Kysely } from 'kysely';
import type { Database } from '../db/database.js';
import { GroupCommit } from '../db/group-commit.js';
import type { DB } from '../db/schema.js';
import type { AuditEventInput, AuditRecord } from './audit-event.js';
import {
  appendIfHeadCarrying,
  readChainHead,
  writeAuditEventsCarrying,
  type AppendRider,
  type ChainHead,
  type TimedAuditEvent,
} from './audit-repository.js';

/**
 * How many times a batch is hashed against the head as it stands and offered again, after
 * another writer moved the head first, before it waits for the chain's lock instead.
 */
const APPEND_ATTEMPTS = 4;

/** What the composition root gives the log; tests may give nothing. */
export interface AuditLogOptions<Change, Answer> {
  now?: () => Date;
  /** Told the size of every batch committed. */
  onCommit?: (batchSize: number) => void;
  /** Told each time a batch found the head moved by another writer and was hashed again. */
  onHeadMoved?: () => void;
  /** What commits with the events that carry a change (`appendCarrying`). */
  rider?: AppendRider<Change, Answer>;
}

/**
 * The append API the rest of toolgate uses. Events that arrive while a commit is in flight
 * are committed together in the next one (group commit); `append` resolves only once its
 * event is durable, and rejects if the commit failed, so a caller never proceeds unaudited.
 */
export class AuditLog<Change = unknown, Answer = unknown> {
  // Typed by `unknown` inside, so that a log is usable wherever any log is; the rider is the one given.
  private readonly batches: GroupCommit<TimedAuditEvent, { record: AuditRecord; answer: unknown }>;
  private readonly rider: AppendRider<unknown, unknown> | undefined;
  private readonly now: () => Date;
  private readonly onHeadMoved: () => void;
  private head: ChainHead | undefined;

  constructor(database: Database, options: AuditLogOptions<Change, Answer> = {}) {
    this.now = options.now ?? (() => new Date());
    this.rider = options.rider;
    this.onHeadMoved = options.onHeadMoved ?? (() => undefined);
    const onCommit = options.onCommit ?? (() => undefined);
    // Appends are per-call statements that must be durable before the call goes on.
    const db = database.hot;
    this.batches = new GroupCommit(async (batch) => {
      const { records, answers } = await this.commit(db, batch);
      onCommit(batch.length);
      return records.map((record, i) => ({ record, answer: answers[i] }));
    });
  }

  /**
   * Appends against the head this replica last wrote (compare and set), hashing again after the head
   * another writer moved; a batch that keeps losing appends under the chain's lock.
   * docs/design/audit-chain.md#appending-group-commit-and-compare-and-set
   */
  private async commit(
    db: Kysely<DB>,
    batch: TimedAuditEvent[],
  ): Promise<{ records: AuditRecord[]; answers: unknown[] }> {
    let head = this.head ?? (await readChainHead(db));
    for (let attempt = 0; attempt < APPEND_ATTEMPTS; attempt += 1) {
      const appended = await appendIfHeadCarrying(db, head, batch, this.rider);
      if (appended.ok) {
        this.head = appended.last;
        return appended;
      }
      this.onHeadMoved();
      head = appended.head;
    }
    this.head = undefined;
    const appended = await db.transaction().execute((trx) => writeAuditEventsCarrying(trx, batch, this.rider));
    const last = appended.records[appended.records.length - 1];
    this.head = last ? { seq: last.seq, hash: last.hash } : undefined;
    return appended;
  }

  async append(event: AuditEventInput): Promise<AuditRecord> {
    return (await this.batches.submit({ event, occurredAt: this.now() })).record;
  }

  /**
   * Appends a record with a change (a run's end, a settlement) in one commit, answered as the rider
   * answers it (undefined with no change). The id is the caller's (the change may name it).
   */
  appendCarrying(
    event: AuditEventInput,
    eventId: string,
    change: Change | undefined,
  ): Promise<{ record: AuditRecord; answer: Answer | undefined }> {
    // The answer is the rider's, whose type is `Answer`.
    return this.batches.submit({
      event,
      occurredAt: this.now(),
      eventId,
      ...(change !== undefined ? { rides: change } : {}),
    }) as Promise<{ record: AuditRecord; answer: Answer | undefined }>;
  }

  appendMany(events: AuditEventInput[]): Promise<AuditRecord[]> {
    return Promise.all(events.map((event) => this.append(event)));
  }

  /** Resolves when everything appended so far has been committed or has failed. */
  drain(): Promise<void> {
    return this.batches.drain();
  }
}
