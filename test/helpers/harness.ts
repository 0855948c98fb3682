import type { FastifyInstance } from 'fastify';
import { pino } from 'pino';
import { buildApp, type AppOptions } from '../../src/app.js';
import { loadVerificationKeys } from '../../src/auth/jwt-keys.js';
import { loadConfig, type Config } from '../../src/config/config.js';
import type { Database } from '../../src/db/database.js';
import { contractViolations } from './contract.js';
import { createTestDatabase, type ChainState, type TestDatabase } from './database.js';
import { TEST_JWT_SECRET } from './tokens.js';

export interface RequestOptions {
  token?: string;
  body?: unknown;
  query?: Record<string, string | number | boolean | undefined>;
  headers?: Record<string, string>;
}

export interface TestResponse<T = any> {
  status: number;
  headers: Record<string, string | string[] | number | undefined>;
  body: T;
  text: string;
}

/** Test configuration: the given environment over a quiet, HS256-secured default. */
export function testConfig(env: Record<string, string> = {}): Config {
  return loadConfig({ TOOLGATE_JWT_SECRET: TEST_JWT_SECRET, LOG_LEVEL: 'silent', ...env });
}

/**
 * Builds an app on a given database and talks to it with `inject()`. Every response is checked
 * against openapi.yaml; an undocumented route, status or shape fails the test on the spot.
 */
export class AppClient {
  constructor(readonly app: FastifyInstance) {}

  static async start(
    database: Database,
    env: Record<string, string> = {},
    options: Pick<AppOptions, 'resolver' | 'now'> = {},
  ): Promise<AppClient> {
    const config = testConfig(env);
    const app = await buildApp({
      config,
      database,
      keys: await loadVerificationKeys(config),
      logger: pino({ level: 'silent' }),
      ...options,
    });
    await app.ready();
    return new AppClient(app);
  }

  async request<T = any>(method: string, url: string, options: RequestOptions = {}): Promise<TestResponse<T>> {
    const headers: Record<string, string> = { ...options.headers };
    if (options.token) headers.authorization = `Bearer ${options.token}`;
    const query = Object.fromEntries(
      Object.entries(options.query ?? {})
        .filter(([, v]) => v !== undefined)
        .map(([k, v]) => [k, String(v)]),
    );
    const response = await this.app.inject({
      method: method as 'GET',
      url,
      query,
      headers,
      ...(options.body !== undefined ? { payload: options.body as object } : {}),
    });
    const violations = contractViolations(
      method,
      url,
      response.statusCode,
      response.headers['content-type'] as string | undefined,
      response.body,
    );
    if (violations.length > 0)
      throw new Error(
        `response breaks openapi.yaml:\n  ${violations.join('\n  ')}\nbody: ${response.body.slice(0, 500)}`,
      );
    let body: unknown = response.body;
    try {
      body = JSON.parse(response.body);
    } catch {
      // not JSON: leave the text
    }
    return { status: response.statusCode, headers: response.headers, body: body as T, text: response.body };
  }

  get = <T = any>(url: string, options?: RequestOptions) => this.request<T>('GET', url, options);
  post = <T = any>(url: string, options?: RequestOptions) => this.request<T>('POST', url, options);
  put = <T = any>(url: string, options?: RequestOptions) => this.request<T>('PUT', url, options);

  close(): Promise<void> {
    return this.app.close();
  }
}

/** A test file's world: its own database and one app on it. */
export interface Harness {
  db: TestDatabase;
  client: AppClient;
  close(): Promise<void>;
}

export async function startHarness(
  env: Record<string, string> = {},
  options: Pick<AppOptions, 'resolver' | 'now'> & { chain?: ChainState } = {},
): Promise<Harness> {
  const { chain, ...appOptions } = options;
  const db = await createTestDatabase(chain === undefined ? {} : { chain });
  const client = await AppClient.start(db.database, env, appOptions);
  return {
    db,
    client,
    close: async () => {
      await client.close();
      await db.drop();
    },
  };
}
