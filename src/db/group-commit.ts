import { isDataException } from './unavailable.js';

/** An answer that fails its own request only (the rest of the batch was committed). */
export class Failed {
  constructor(readonly error: unknown) {}
}

/**
 * Requests arriving while a batch commits go together in the next one. A batch PostgreSQL refused a value of is retried
 * one request at a time, so `commit` must write nothing when it throws: docs/design/database-pools.md#group-commit.
 */
export class GroupCommit<Request, Result> {
  private queue: Array<{ request: Request; resolve: (result: Result) => void; reject: (error: unknown) => void }> = [];
  private flushing: Promise<void> | undefined;

  constructor(
    private readonly commit: (batch: Request[]) => Promise<Array<Result | Failed>>,
    private readonly maxBatch = 500,
  ) {}

  submit(request: Request): Promise<Result> {
    return new Promise((resolve, reject) => {
      this.queue.push({ request, resolve, reject });
      this.flushing ??= this.flush();
    });
  }

  private async oneByOne(batch: typeof this.queue): Promise<void> {
    for (const pending of batch) {
      try {
        const [result] = await this.commit([pending.request]);
        settle(pending, result!);
      } catch (error) {
        pending.reject(error);
      }
    }
  }

  /** Whether a batch is being committed, or requests wait for one. */
  busy(): boolean {
    return this.flushing !== undefined || this.queue.length > 0;
  }

  /** Resolves when everything submitted so far has been committed or has failed. */
  async drain(): Promise<void> {
    while (this.flushing) await this.flushing;
  }

  private async flush(): Promise<void> {
    try {
      // Two turns of the event loop let a burst, and the requests its waiting I/O submits, join the first batch: cheap
      // when idle, and under load larger batches, so fewer statements per call.
      await nextTurn();
      await nextTurn();
      while (this.queue.length > 0) {
        const batch = this.queue.splice(0, this.maxBatch);
        try {
          const results = await this.commit(batch.map((pending) => pending.request));
          batch.forEach((pending, i) => settle(pending, results[i]!));
        } catch (error) {
          if (batch.length > 1 && isDataException(error)) await this.oneByOne(batch);
          else for (const pending of batch) pending.reject(error);
        }
      }
    } finally {
      // Cleared in the same turn as the empty-queue check: a request submitted right after
      // starts a new flush instead of waiting in a queue nobody drains.
      this.flushing = undefined;
    }
  }
}

function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

function settle<Result>(
  pending: { resolve: (result: Result) => void; reject: (error: unknown) => void },
  answer: Result | Failed,
): void {
  if (answer instanceof Failed) pending.reject(answer.error);
  else pending.resolve(answer);
}

const RETRYABLE = new Set(['40P01', '40001']);

/** A deadlock victim or a serialization failure: nothing was committed, so a retry is safe. */
export function isConflict(error: unknown): boolean {
  const code = (error as { code?: unknown }).code;
  return typeof code === 'string' && RETRYABLE.has(code);
}

/**
 * Runs a transaction again when PostgreSQL aborted it as a deadlock victim or a serialization
 * failure: nothing of it was committed, so a retry is safe.
 */
export async function retryOnConflict<T>(run: () => Promise<T>, attempts = 3): Promise<T> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      return await run();
    } catch (error) {
      if (attempt >= attempts || !isConflict(error)) throw error;
    }
  }
}
