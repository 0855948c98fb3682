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
