import { isRecordFault } from './unavailable.js';

/** An answer that fails its own request only (the rest of the batch was committed). */
export class Failed {
  constructor(readonly error: unknown) {}
}

/**
 * Requests arriving while a batch commits go together in the next one. A batch PostgreSQL refused for the values of
 * some of its members is committed again in halves until only those members fail, so `commit` must write nothing when
 * it throws: docs/design/database-pools.md#group-commit.
 */
export class GroupCommit<Request, Result> {
  private queue: Pending<Request, Result>[] = [];
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

  /**
   * Commits a batch, and again without the members whose values PostgreSQL refused: a batch it threw for goes again
   * in halves (each half in order, so arrival order holds), and the members it answered `Failed` for such a refusal
   * (when more than one: one of them may have failed the others) go again apart from the rest. Each round is
   * smaller than the last, so a batch of n with k bad members costs about k·log₂(n) more commits, and only the bad
   * members fail.
   */
  private async commitApart(batch: Pending<Request, Result>[]): Promise<void> {
    let answers: Array<Result | Failed>;
    try {
      answers = await this.commit(batch.map((pending) => pending.request));
    } catch (error) {
      if (batch.length > 1 && isRecordFault(error)) await this.halves(batch);
      else for (const pending of batch) pending.reject(error);
      return;
    }
    const again: Pending<Request, Result>[] = [];
    batch.forEach((pending, i) => {
      const answer = answers[i]!;
      if (answer instanceof Failed && isRecordFault(answer.error)) again.push(pending);
      else settle(pending, answer);
    });
    if (again.length === 1) settle(again[0]!, answers[batch.indexOf(again[0]!)]!);
    else if (again.length === batch.length) await this.halves(again);
    else if (again.length > 1) await this.commitApart(again);
  }

  private async halves(batch: Pending<Request, Result>[]): Promise<void> {
    const middle = Math.ceil(batch.length / 2);
    await this.commitApart(batch.slice(0, middle));
    await this.commitApart(batch.slice(middle));
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
        await this.commitApart(this.queue.splice(0, this.maxBatch));
      }
    } finally {
      // Cleared in the same turn as the empty-queue check: a request submitted right after
      // starts a new flush instead of waiting in a queue nobody drains.
      this.flushing = undefined;
    }
  }
}

interface Pending<Request, Result> {
  request: Request;
  resolve: (result: Result) => void;
  reject: (error: unknown) => void;
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
