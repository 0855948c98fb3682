import pg from 'pg';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A PostgreSQL server for the tests, or '' when only embedded PGlite is available. */
    testDatabaseUrl: string;
  }
}

/**
 * Picks the PostgreSQL the tests run against: DATABASE_URL when set (CI and our machines);
 * otherwise a throwaway container when Docker is available; otherwise none, and the tests
 * fall back to embedded PGlite (multi-connection tests then say they are skipped and why).
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const fromEnv = process.env.DATABASE_URL;
  if (fromEnv) {
    await ensureDatabase(fromEnv);
    project.provide('testDatabaseUrl', fromEnv);
    return async () => undefined;
  }
  try {
    const { PostgreSqlContainer } = await import('@testcontainers/postgresql');
    const container = await new PostgreSqlContainer('postgres:15-alpine').start();
    project.provide('testDatabaseUrl', container.getConnectionUri());
    return async () => {
      await container.stop();
    };
  } catch (error) {
    process.stderr.write(
      `No DATABASE_URL and no Docker (${(error as Error).message.split('\n')[0]}); tests use embedded PGlite.\n`,
    );
    project.provide('testDatabaseUrl', '');
    return async () => undefined;
  }
}

/**
 * Tests create their own databases from a connection to the one DATABASE_URL names: on a fresh
 * server that one may not exist yet (only `postgres` does), so it is created first.
 */
async function ensureDatabase(url: string): Promise<void> {
  const probe = new pg.Client({ connectionString: url });
  try {
    await probe.connect();
    await probe.end();
    return;
  } catch (error) {
    await probe.end().catch(() => undefined);
    if ((error as { code?: string }).code !== '3D000') throw error;
  }
  const name = decodeURIComponent(new URL(url).pathname.slice(1));
  const maintenance = new URL(url);
  maintenance.pathname = '/postgres';
  const admin = new pg.Client({ connectionString: maintenance.toString() });
  await admin.connect();
  try {
    await admin.query(`CREATE DATABASE ${pg.escapeIdentifier(name)}`);
  } catch (error) {
    // Another run created it meanwhile.
    if ((error as { code?: string }).code !== '42P04') throw error;
  } finally {
    await admin.end();
  }
}
