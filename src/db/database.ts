import { mkdir } from 'node:fs/promises';
import { EventEmitter } from 'node:events';
import { Kysely, PostgresDialect, sql } from 'kysely';
import pg from 'pg';
import type { Logger } from 'pino';
import { NamedStatementPool } from './named-statements.js';
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

/**
 * The database every room receives from the composition root. Repositories pick the pool by what
 * a statement is for; nothing else chooses. See docs/design/database-pools.md.
 */
export interface Database {
  readonly kind: 'postgres' | 'pglite';
  /** Operator queries, sweeps, migrations and every transaction: planned with each execution's values. */
  readonly control: Kysely<DB>;
  /** The per-call statements durable at commit (audit appends, run ends, settlements, grant reads): plans kept. */
  readonly hot: Kysely<DB>;
  /** The per-call statements a later synchronous commit makes durable (claims, reservations, takes): no wait for the disk. */
  readonly hotDeferred: Kysely<DB>;
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

/** Kept generic plans that stay index lookups however the tables grow; no JIT (see database-pools.md). */
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
  // Each group commit has one batch in flight at a time, so a handful of connections carry the calls.
  const hotSize = Math.max(2, Math.ceil(poolSize / 4));
  const open = (size: number, name: string, settings: string[]) =>
    new Kysely<DB>({
      dialect: new PostgresDialect({
        pool: new NamedStatementPool(
          openPool(connectionString, size, hotSize, logger, name, settings, connections),
          sent,
        ),
      }),
    });
  const control = open(poolSize, 'toolgate', ['plan_cache_mode=force_custom_plan']);
  const hot = open(hotSize, 'toolgate-hot', HOT_SETTINGS);
  const hotDeferred = open(hotSize, 'toolgate-hot-async', [...HOT_SETTINGS, 'synchronous_commit=off']);
  const listener = new PgNotificationListener(connectionString, logger);
  return {
    kind: 'postgres',
    control,
    hot,
    hotDeferred,
    listener,
    statementsSent: () => sent.count,
    ping: async () => {
      await sql`select 1`.execute(control);
    },
    // A connection still busy, or whose server is silent, is destroyed after CLOSE_STEP_WAIT_MS.
    close: async () => {
      const pools = Promise.all([control.destroy(), hot.destroy(), hotDeferred.destroy()]);
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
  connections: Set<pg.Client>,
): pg.Pool {
  const pool = new pg.Pool({
    connectionString,
    max,
    min: Math.min(min, max),
    connectionTimeoutMillis: 3_000,
    idleTimeoutMillis: 30_000,
    application_name: applicationName,
    // A silent partition fails calls closed in seconds instead of hanging them.
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
  });
  return pool;
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
    control: db,
    hot: db,
    hotDeferred: db,
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
/** Apps sharing one Database (tests build several) each add their copies' listeners. */
const LISTENERS_PER_DATABASE = 64;

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
    // Every copy kept in memory (registry, kill switches, grants) listens for reconnects, per app on this Database.
    this.setMaxListeners(LISTENERS_PER_DATABASE);
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
    // Every copy kept in memory (registry, kill switches, grants) listens for reconnects, per app on this Database.
    this.setMaxListeners(LISTENERS_PER_DATABASE);
  }

  async subscribe(channel: string, handler: NotificationHandler): Promise<void> {
    this.unsubscribers.push(await this.pglite.listen(channel, handler));
  }

  async close(): Promise<void> {
    this.connected = false;
    for (const unsubscribe of this.unsubscribers.splice(0)) await unsubscribe().catch(() => undefined);
  }
}
