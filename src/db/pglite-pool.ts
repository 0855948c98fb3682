import type { PGlite } from '@electric-sql/pglite';
import type { PostgresPool, PostgresPoolClient } from 'kysely';

/**
 * Presents one embedded PGlite instance as the pool kysely's PostgresDialect expects.
 * PGlite is a single session, so connections are handed out one at a time: a transaction
 * never interleaves with another caller's statements.
 */
export class PGlitePool implements PostgresPool {
  private tail: Promise<void> = Promise.resolve();
  /** Statements run so far. */
  statementsSent = 0;

  constructor(private readonly pglite: PGlite) {}

  async connect(): Promise<PostgresPoolClient> {
    let release!: () => void;
    const previous = this.tail;
    this.tail = new Promise<void>((resolve) => {
      release = resolve;
    });
    await previous;
    const pglite = this.pglite;
    const counted = () => (this.statementsSent += 1);
    let released = false;
    return {
      async query(sql: string, parameters: ReadonlyArray<unknown>) {
        counted();
        const command = sql.trimStart().split(/\s+/, 1)[0]?.toUpperCase() ?? '';
        if (parameters.length === 0 && sql.includes(';')) {
          // Multi-statement scripts (migrations) need the simple protocol.
          const results = await pglite.exec(sql);
          const last = results[results.length - 1];
          return { command: command as never, rowCount: last?.affectedRows ?? 0, rows: (last?.rows ?? []) as never[] };
        }
        const result = await pglite.query(sql, parameters as unknown[]);
        return {
          command: command as never,
          rowCount: result.affectedRows ?? result.rows.length,
          rows: result.rows as never[],
        };
      },
      release() {
        if (!released) {
          released = true;
          release();
        }
      },
    } as unknown as PostgresPoolClient;
  }

  async end(): Promise<void> {
    await this.pglite.close();
  }
}
