import { createHash } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { EventEmitter } from 'node:events';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import type { Logger } from 'pino';
import { PGlitePool } from './pglite-pool.js';
import type { DB } from './schema.js';
import { waitAtMost } from './wait-at-most.js';
import type { PGlite } from '@electric-sql/pglite';

export type NotificationHandler = (payload: string) => void;

/**
 * Delivers PostgreSQL NOTIFY messages. Emits `connected` each time it (re)establishes its
 * subscription, since notifications sent while it was away are lost: subscribers reload then.
 * Emits `disconnected` when the subscription drops.
 */
export interface NotificationListener extends EventEmitter {
  readonly connected: boolean;
  subscribe(channel: string, handler: NotificationHandler): Promise<void>;
  close(): Promise<void>;
}

/** The database handle every room receives from the composition root. */
export interface Database {
  readonly kind: 'postgres' | 'pglite';
  readonly db: Kysely<DB>;
  /**
   * The connections for the statements every call sends (the group-committed claims, grant
   * reads, ledger and bucket writes, audit appends, run ends). Each is keyed by primary or
   * unique keys, so it is planned once per connection, as index lookups joined by nested
   * loops, and that plan is kept: planning these statements again for every execution cost as
   * much as running them. Everything else (operator queries, whose best plan depends on their
   * filters) uses `db`, planned for each execution. On PGlite both are the same.
   */
  readonly hot: Kysely<DB>;
  /**
   * `hot`, with `synchronous_commit` off: a commit returns before its WAL reaches the disk. For
   * the per-call statements whose effects stay inside toolgate until a later synchronous commit
   * on the same server: the run's claim, its grant-use records, budget reservations and
   * settlements, rate-limit takes. PostgreSQL writes WAL in order, so the synchronous commit of
   * the call's intent record (before its backend is contacted) and of the run's end (before the
   * answer) make every earlier commit durable too; a crash before them loses only effects
   * nobody outside has seen. On PGlite, the same as `db`.
   */
  readonly hotAsync: Kysely<DB>;
  readonly listener: NotificationListener;
  /** Statements sent to the server so far (round trips; the hot path's cost, see /metrics). */
  statementsSent(): number;
  ping(): Promise<void>;
  close(): Promise<void>;
}

export interface DatabaseOptions {
  databaseUrl: string | undefined;
  dataDir: string;
  poolSize: number;
  logger: Logger;
}

// int8 and numeric arrive as strings from pg; toolgate's int8 columns fit in a double.
pg.types.setTypeParser(pg.types.builtins.INT8, (value) => Number(value));

export async function openDatabase(options: DatabaseOptions): Promise<Database> {
  if (options.databaseUrl) return openPostgres(options.databaseUrl, options.poolSize, options.logger);
  return openPGlite(options.dataDir);
}

/**
 * Session settings of the hot pool's connections. A plan is made once per connection (generic)
 * and kept; since it may be made while the tables are still nearly empty, it must not be one
 * that is good only for small tables: sequential scans, bitmap scans and hash or merge joins
 * are ruled out, leaving index lookups joined by nested loops, which is what keyed statements
 * want at any size. (A statement with no index to use still runs, with a sequential scan.)
 * JIT compilation is off: a ruled-out scan is priced past `jit_above_cost`, and a statement that
 * had to use one was compiled on every run (about 100 ms of CPU for the reservation sweep's on
 * an empty table); keyed statements never gain from it.
 */
const HOT_SETTINGS = [
  'plan_cache_mode=force_generic_plan',
  'enable_seqscan=off',
  'enable_bitmapscan=off',
  'enable_hashjoin=off',
  'enable_mergejoin=off',
  'jit=off',
];

function openPostgres(connectionString: string, poolSize: number, logger: Logger): Database {
  const sent = { count: 0 };
  const connections = new Set<pg.Client>();
  // The pool size is that of the general pool, where prepared statements are parsed once but
  // planned for each execution, with its values and the tables as they are now (operator
  // queries: the best plan depends on their filters). The per-call statements have two pools of
  // a quarter of that size each: each group commit has one batch in flight at a time, so a
  // handful of connections carry them.
  const hotSize = Math.max(2, Math.ceil(poolSize / 4));
  // The hot pools keep every connection they opened (and the general pool as many) however long
  // it sits idle: a replica that had been quiet for the idle timeout met its next calls with new
  // connections — connect, session settings, every statement parsed and planned again — and
  // those calls waited for them (a trace at 50 calls/s: 5.5 ms for one such connection).
  const general = openPool(
    connectionString,
    poolSize,
    hotSize,
    logger,
    'toolgate',
    ['plan_cache_mode=force_custom_plan'],
    sent,
    connections,
  );
  const hotPool = openPool(connectionString, hotSize, hotSize, logger, 'toolgate-hot', HOT_SETTINGS, sent, connections);
  const hotAsyncPool = openPool(
    connectionString,
    hotSize,
    hotSize,
    logger,
    'toolgate-hot-async',
    [...HOT_SETTINGS, 'synchronous_commit=off'],
    sent,
    connections,
  );
  const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool: general }) });
  const hot = new Kysely<DB>({ dialect: new PostgresDialect({ pool: hotPool }) });
  const hotAsync = new Kysely<DB>({ dialect: new PostgresDialect({ pool: hotAsyncPool }) });
  const listener = new PgNotificationListener(connectionString, logger);
  return {
    kind: 'postgres',
    db,
    hot,
    hotAsync,
    listener,
    statementsSent: () => sent.count,
    ping: async () => {
      await sql`select 1`.execute(db);
    },
    // The pools end once every connection is back and each has said goodbye. A connection still
    // busy (a statement a closing step gave up on), or whose server does not answer (a silent
    // partition), is destroyed after CLOSE_STEP_WAIT_MS instead of being waited for.
    close: async () => {
      const pools = Promise.all([db.destroy(), hot.destroy(), hotAsync.destroy()]);
      const ended = pools.then(() =>
        Promise.all([...connections].map((client) => new Promise((resolve) => client.once('end', resolve)))),
      );
      const [, settled] = await Promise.all([listener.close(), waitAtMost(ended)]);
      if (!settled) for (const client of connections) destroyConnection(client);
      await pools;
    },
  };
}

/**
 * Closes a connection without waiting for its server: a statement in flight fails, and its
 * socket is destroyed. (Ended first, so that pg reports no unexpected disconnection.)
 */
function destroyConnection(client: pg.Client): void {
  client.end().catch(() => undefined);
  client.connection.stream.destroy();
}

/** Ends a connection, gracefully if its server answers within CLOSE_STEP_WAIT_MS, else by destroying it. */
async function endConnection(client: pg.Client): Promise<void> {
  if (!(await waitAtMost(client.end()))) destroyConnection(client);
}

function openPool(
  connectionString: string,
  max: number,
  /** Connections never closed for sitting idle (pg-pool opens them when needed, not ahead). */
  min: number,
  logger: Logger,
  applicationName: string,
  settings: string[],
  sent: { count: number },
  connections: Set<pg.Client>,
): pg.Pool {
  const pool = new pg.Pool({
    connectionString,
    max,
    min: Math.min(min, max),
    connectionTimeoutMillis: 3_000,
    idleTimeoutMillis: 30_000,
    application_name: applicationName,
    // A connection that hangs silently (a partition) must fail in seconds, not minutes, so that
    // calls fail closed with 503 instead of waiting: the server cancels long statements, the
    // client gives up on answers that never come, and keep-alive notices dead peers.
    statement_timeout: 15_000,
    query_timeout: 20_000,
    keepAlive: true,
    keepAliveInitialDelayMillis: 10_000,
  });
  // An idle client losing its server must not crash the process; the next query reports it.
  pool.on('error', (error) => logger.warn({ err: error }, 'idle database connection failed'));
  // pg-pool listens for errors only on idle clients; a checked-out client whose server goes away
  // would emit an unhandled 'error' and kill the process. The query in flight rejects regardless.
  pool.on('connect', (client) => {
    connections.add(client as pg.Client);
    client.once('end', () => connections.delete(client as pg.Client));
    client.on('error', (error) => logger.warn({ err: error }, 'database connection failed'));
    // Queued before any query the pool hands the client out for.
    const set = settings.map((setting) => `SET ${setting.replace('=', ' = ')}`).join('; ');
    client
      .query(set)
      .catch((error: unknown) => logger.warn({ err: error, settings }, 'could not apply session settings'));
    prepareRepeatedStatements(client, sent);
  });
  return pool;
}

/** Statement texts named so far (null: never again), and the bound on how many get a name. */
const statementNames = new Map<string, string | null>();
const MAX_NAMED_STATEMENTS = 500;

function statementName(text: string, parameterCount: number): string | undefined {
  let name = statementNames.get(text);
  // A text with a long parameter list is usually one of many (an IN list of varying length).
  if (name === undefined && statementNames.size < MAX_NAMED_STATEMENTS && parameterCount <= 64) {
    name = `tg_${createHash('sha256').update(text).digest('hex').slice(0, 24)}`;
    statementNames.set(text, name);
  }
  return name ?? undefined;
}

/**
 * A prepared statement whose result columns changed under it (a migration added a column to a
 * table it selects with `*`) fails on every connection that prepared it, for good.
 */
function isStalePlan(error: unknown): boolean {
  return (
    (error as { code?: unknown }).code === '0A000' &&
    /cached plan must not change result type/.test(String((error as Error).message))
  );
}

/**
 * Sends every parameterised statement as a named prepared statement: each connection parses it
 * once and afterwards only binds and executes it, instead of parsing it again for every call.
 * The hot path's statements repeat for every call. Statements without parameters (begin,
 * commit) stay simple queries. A statement whose result columns a migration changed fails once
 * and is never prepared again (by any connection).
 */
function prepareRepeatedStatements(client: pg.PoolClient, sent: { count: number }): void {
  const query = client.query.bind(client) as (...args: unknown[]) => unknown;
  (client as unknown as { query: (...args: unknown[]) => unknown }).query = (
    config: unknown,
    values?: unknown,
    callback?: unknown,
  ) => {
    sent.count += 1;
    if (typeof config === 'string' && Array.isArray(values) && values.length > 0 && callback === undefined) {
      const name = statementName(config, values.length);
      if (name !== undefined) {
        return (query({ name, text: config, values }) as Promise<unknown>).catch((error: unknown) => {
          if (isStalePlan(error)) statementNames.set(config, null);
          throw error;
        });
      }
    }
    return query(config, values, callback);
  };
}

async function openPGlite(dataDir: string): Promise<Database> {
  const { PGlite } = await import('@electric-sql/pglite');
  // `memory://` keeps the database in memory (tests); anything else is a folder.
  if (!dataDir.startsWith('memory://')) await mkdir(dataDir, { recursive: true });
  const pglite = await PGlite.create(dataDir);
  const pool = new PGlitePool(pglite);
  const db = new Kysely<DB>({ dialect: new PostgresDialect({ pool }) });
  const listener = new PGliteNotificationListener(pglite);
  return {
    kind: 'pglite',
    db,
    hot: db,
    hotAsync: db,
    listener,
    statementsSent: () => pool.statementsSent,
    ping: async () => {
      await sql`select 1`.execute(db);
    },
    close: async () => {
      await listener.close();
      await db.destroy();
    },
  };
}

/** A dedicated pg connection for LISTEN that reconnects by itself with backoff. */
class PgNotificationListener extends EventEmitter implements NotificationListener {
  private client: pg.Client | undefined;
  /** The connection being established, until it is (or fails). */
  private opening: pg.Client | undefined;
  private readonly handlers = new Map<string, NotificationHandler[]>();
  private closed = false;
  private connecting: Promise<void> | undefined;
  private retryDelayMs = 100;
  private retryTimer: NodeJS.Timeout | undefined;
  connected = false;

  constructor(
    private readonly connectionString: string,
    private readonly logger: Logger,
  ) {
    super();
  }

  async subscribe(channel: string, handler: NotificationHandler): Promise<void> {
    const list = this.handlers.get(channel);
    if (list) {
      list.push(handler);
      return;
    }
    this.handlers.set(channel, [handler]);
    if (this.connected && this.client) {
      await this.client.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    } else {
      await this.connect();
    }
  }

  private connect(): Promise<void> {
    if (this.closed) return Promise.resolve();
    this.connecting ??= this.establish().finally(() => {
      this.connecting = undefined;
    });
    return this.connecting;
  }

  private async establish(): Promise<void> {
    const client = new pg.Client({
      connectionString: this.connectionString,
      connectionTimeoutMillis: 3_000,
      keepAlive: true,
      keepAliveInitialDelayMillis: 10_000,
      application_name: 'toolgate-listener',
    });
    client.on('notification', (message) => {
      for (const handler of this.handlers.get(message.channel) ?? []) handler(message.payload ?? '');
    });
    client.on('error', (error) => this.dropped(client, error));
    client.on('end', () => this.dropped(client, undefined));
    this.opening = client;
    try {
      await client.connect();
      for (const channel of this.handlers.keys()) {
        await client.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
      }
    } catch (error) {
      this.dropped(client, error as Error);
      return;
    } finally {
      this.opening = undefined;
    }
    if (this.closed) {
      await endConnection(client);
      return;
    }
    this.client = client;
    this.connected = true;
    this.retryDelayMs = 100;
    this.emit('connected');
  }

  private dropped(client: pg.Client, error: Error | undefined): void {
    if (this.client !== undefined && this.client !== client) return;
    client.removeAllListeners('end');
    client.on('error', () => undefined);
    client.end().catch(() => undefined);
    this.client = undefined;
    if (this.connected) {
      this.connected = false;
      this.logger.warn({ err: error }, 'notification listener disconnected');
      this.emit('disconnected');
    }
    if (this.closed || this.retryTimer) return;
    const delay = this.retryDelayMs;
    this.retryDelayMs = Math.min(this.retryDelayMs * 2, 2_000);
    this.retryTimer = setTimeout(() => {
      this.retryTimer = undefined;
      void this.connect();
    }, delay);
    this.retryTimer.unref();
  }

  /**
   * Ends the connection (destroyed if its server does not answer in time), or destroys the one
   * being established. That one is never ended: pg never settles a `connect()` that `end()` cut
   * short, and closing would wait for it for ever (a close during a reconnection after an outage).
   */
  async close(): Promise<void> {
    this.closed = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    const client = this.client;
    const opening = this.opening;
    this.client = undefined;
    this.connected = false;
    if (opening) opening.connection.stream.destroy();
    if (client) {
      client.removeAllListeners('end');
      await endConnection(client);
    }
    await waitAtMost(this.connecting);
  }
}

/** The embedded database notifies in-process; it is always connected while open. */
class PGliteNotificationListener extends EventEmitter implements NotificationListener {
  private readonly unsubscribers: Array<() => Promise<void>> = [];
  connected = true;

  constructor(private readonly pglite: PGlite) {
    super();
  }

  async subscribe(channel: string, handler: NotificationHandler): Promise<void> {
    this.unsubscribers.push(await this.pglite.listen(channel, handler));
  }

  async close(): Promise<void> {
    this.connected = false;
    for (const unsubscribe of this.unsubscribers.splice(0)) await unsubscribe().catch(() => undefined);
  }
}
