import { createHash } from 'node:crypto';
import type { PostgresPool, PostgresPoolClient, PostgresQueryResult } from 'kysely';
import type pg from 'pg';

/** Names one connection prepares at most; a text with more parameters is usually one of many (an IN list). */
const MAX_NAMED_PER_CONNECTION = 500;
const MAX_NAMED_PARAMETERS = 64;

/**
 * The pool Kysely's PostgresDialect talks to: each parameterised statement goes out as pg's
 * `{ name, text, values }`, so each connection parses it once. See docs/design/database-pools.md.
 */
export class NamedStatementPool implements PostgresPool {
  private readonly clients = new WeakMap<pg.PoolClient, NamedStatementClient>();

  constructor(
    private readonly pool: pg.Pool,
    private readonly sent: { count: number },
  ) {}

  async connect(): Promise<PostgresPoolClient> {
    const client = await this.pool.connect();
    let named = this.clients.get(client);
    if (!named) {
      named = new NamedStatementClient(client, this.sent);
      this.clients.set(client, named);
    }
    return named as unknown as PostgresPoolClient;
  }

  end(): Promise<void> {
    return this.pool.end();
  }
}

/** One connection, with the names it prepared (null: a text it must not prepare again). */
class NamedStatementClient {
  private readonly names = new Map<string, string | null>();

  constructor(
    private readonly client: pg.PoolClient,
    private readonly sent: { count: number },
  ) {}

  async query<R>(text: string, parameters: ReadonlyArray<unknown>): Promise<PostgresQueryResult<R>> {
    this.sent.count += 1;
    const values = [...parameters];
    const name = this.nameOf(text, values.length);
    if (name === undefined) return (await this.client.query(text, values)) as unknown as PostgresQueryResult<R>;
    try {
      return (await this.client.query({ name, text, values })) as unknown as PostgresQueryResult<R>;
    } catch (error) {
      if (isStalePlan(error)) this.names.set(text, null);
      throw error;
    }
  }

  release(destroy?: boolean): void {
    this.client.release(destroy);
  }

  /** Statements without parameters (begin, commit) stay simple queries. */
  private nameOf(text: string, parameterCount: number): string | undefined {
    let name = this.names.get(text);
    if (
      name === undefined &&
      parameterCount > 0 &&
      parameterCount <= MAX_NAMED_PARAMETERS &&
      this.names.size < MAX_NAMED_PER_CONNECTION
    ) {
      name = `tg_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
      this.names.set(text, name);
    }
    return name ?? undefined;
  }
}

/** A prepared statement whose result columns a migration changed fails on its connection for good. */
function isStalePlan(error: unknown): boolean {
  return (
    (error as { code?: unknown }).code === '0A000' &&
    /cached plan must not change result type/.test(String((error as Error).message))
  );
}
