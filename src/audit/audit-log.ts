import type { Database } from '../db/database.js';
import { GroupCommit } from '../db/group-commit.js';
import type { AuditEventInput, AuditRecord } from './audit-event.js';
import {
  appendCarrying,
  assertStorableHashes,
  type AppendGuard,
  type AppendRider,
  type TimedAuditEvent,
} from './audit-repository.js';

/** How long the chain counts as shared after a batch last found another writer's head. */
const SHARED_FOR_MS = 1_000;

/** What the composition root gives the log; tests may give nothing. */
export interface AuditLogOptions<Change, Answer, Guard, GuardAnswer> {
  now?: () => Date;
  /** Told the size of every batch committed. */
  onCommit?: (batchSize: number) => void;
  /** What commits with the events that carry a change (`appendCarrying`). */
  rider?: AppendRider<Change, Answer>;
  /** What an event appended only with its change makes (`appendIf`). */
  guard?: AppendGuard<Guard, GuardAnswer>;
}

/**
 * The append API the rest of toolgate uses. Events that arrive while a commit is in flight
 * are committed together in the next one (group commit); `append` resolves only once its
 * event is durable, and rejects if the commit failed, so a caller never proceeds unaudited.
 */
export class AuditLog<Change = unknown, Answer = unknown, Guard = unknown, GuardAnswer = unknown> {
  // Typed by `unknown` inside, so that a log is usable wherever any log is; the rider is the one given.
  private readonly batches: GroupCommit<TimedAuditEvent, { record: AuditRecord | undefined; answer: unknown }>;
  private readonly rider: AppendRider<unknown, unknown> | undefined;
  private readonly guard: AppendGuard<unknown, unknown> | undefined;
  private readonly now: () => Date;
  /** The seq of the last record this log appended (or the head its last batch found). */
  private lastSeq: number | undefined;
  /** When (this process's monotonic clock) a batch last found a head this log had not left. */
  private sharedAt = Number.NEGATIVE_INFINITY;

  constructor(database: Database, options: AuditLogOptions<Change, Answer, Guard, GuardAnswer> = {}) {
    this.now = options.now ?? (() => new Date());
    this.rider = options.rider;
    this.guard = options.guard as AppendGuard<unknown, unknown> | undefined;
    const onCommit = options.onCommit ?? (() => undefined);
    // Appends are per-call statements that must be durable before the call goes on.
    const db = database.hot;
    this.batches = new GroupCommit(async (batch) => {
      // One statement whatever other replicas do: the database links the batch after the head it finds.
      const { records, after, appended, answers } = await appendCarrying(db, batch, this.rider, this.guard);
      // A head this log did not leave: someone else appended since its last batch.
      if (after) {
        if (this.lastSeq !== undefined && after.seq !== this.lastSeq) this.sharedAt = performance.now();
        this.lastSeq = records.length > 0 ? records[records.length - 1]!.seq : after.seq;
      }
      onCommit(records.length);
      let next = 0;
      return batch.map((_, i) => ({ record: appended[i] ? records[next++] : undefined, answer: answers[i] }));
    });
  }

  async append(event: AuditEventInput): Promise<AuditRecord> {
    assertStorableHashes(event);
    return (await this.batches.submit({ event, occurredAt: this.now() })).record!;
  }

  /**
   * Appends a record only with its change (the guard's): in one commit, or neither. No record when the
   * change could not be made (the caller decides again, the usual way); the guard's answer either way.
   */
  async appendIf(
    event: AuditEventInput,
    eventId: string,
    change: Guard,
  ): Promise<{ record: AuditRecord | undefined; answer: GuardAnswer | undefined }> {
    assertStorableHashes(event);
    // The answer is the guard's, whose type is `GuardAnswer`.
    return (await this.batches.submit({ event, occurredAt: this.now(), eventId, onlyIf: change })) as {
      record: AuditRecord | undefined;
      answer: GuardAnswer | undefined;
    };
  }

  /**
   * Appends a record with a change (a run's end, a settlement) in one commit, answered as the rider
   * answers it (undefined with no change). The id is the caller's (the change may name it).
   */
  async appendCarrying(
    event: AuditEventInput,
    eventId: string,
    change: Change | undefined,
  ): Promise<{ record: AuditRecord; answer: Answer | undefined }> {
    assertStorableHashes(event);
    // The answer is the rider's, whose type is `Answer`.
    return this.batches.submit({
      event,
      occurredAt: this.now(),
      eventId,
      ...(change !== undefined ? { rides: change } : {}),
    }) as Promise<{ record: AuditRecord; answer: Answer | undefined }>; // never dropped: it has no guard
  }

  appendMany(events: AuditEventInput[]): Promise<AuditRecord[]> {
    return Promise.all(events.map((event) => this.append(event)));
  }

  /** Whether an append is being committed, or appends wait for one. */
  busy(): boolean {
    return this.batches.busy();
  }

  /**
   * Whether others (another replica, a control-plane change) appended to the chain between this log's batches in the
   * last `SHARED_FOR_MS`: the chain head is then shared, and what an append holds it for delays them too.
   */
  shared(): boolean {
    return performance.now() - this.sharedAt < SHARED_FOR_MS;
  }

  /** Resolves when everything appended so far has been committed or has failed. */
  drain(): Promise<void> {
    return this.batches.drain();
  }
}
