import { appendFileSync, copyFileSync, mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { sql } from 'kysely';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { AuditLog } from '../src/audit/audit-log.js';
import { verifyAuditChain } from '../src/audit/chain-verification.js';
import { openDatabase } from '../src/db/database.js';
import { MigrationChangedError, migrate, migrationsDir } from '../src/db/migrate.js';
import { AppClient } from './helpers/harness.js';
import { createEmptyDatabaseUrl, hasPostgresServer } from './helpers/database.js';

const logger = pino({ level: 'silent' });

describe.skipIf(!hasPostgresServer)('migrations (needs a PostgreSQL server for several connections)', () => {
  it('lets several instances start at once against one fresh database: each file applied once', async () => {
    const empty = await createEmptyDatabaseUrl();
    const instances = await Promise.all(
      [0, 1, 2].map(() => openDatabase({ databaseUrl: empty.url, dataDir: '', poolSize: 3, logger })),
    );
    try {
      const results = await Promise.all(instances.map((instance) => migrate(instance.control)));
      const appliedCounts = results.map((r) => r.applied.length).sort();
      expect(appliedCounts.filter((n) => n > 0)).toHaveLength(1);
      const clients = await Promise.all(instances.map((instance) => AppClient.start(instance)));
      for (const client of clients) expect((await client.get('/ready')).status).toBe(200);
      await Promise.all(clients.map((client) => client.close()));
      const rows = await sql<{ n: number }>`select count(*)::int as n from schema_migrations`.execute(
        instances[0]!.control,
      );
      expect(rows.rows[0]!.n).toBe(Math.max(...appliedCounts));
      expect((await migrate(instances[0]!.control)).applied).toEqual([]);
    } finally {
      await Promise.all(instances.map((instance) => instance.close()));
      await empty.drop();
    }
  });
});

describe('migrations on the embedded database', () => {
  it('apply the same files to PGlite, idempotently', async () => {
    const database = await openDatabase({ databaseUrl: undefined, dataDir: 'memory://', poolSize: 1, logger });
    try {
      const first = await migrate(database.control);
      expect(first.applied.length).toBeGreaterThan(0);
      expect((await migrate(database.control)).applied).toEqual([]);
      await new AuditLog(database).append({ event_type: 'test.event', actor: 'system.test' });
      await expect(sql`delete from audit_events`.execute(database.control)).rejects.toThrow(/append-only/);
      expect((await verifyAuditChain(database.control)).ok).toBe(true);
    } finally {
      await database.close();
    }
  });
});

describe('migrations carry checksums', () => {
  it('stop start-up, naming the file, when a migration changed after it was applied; adopt the checksum of one applied before checksums', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'toolgate-migrations-'));
    for (const file of readdirSync(migrationsDir)) copyFileSync(join(migrationsDir, file), join(dir, file));
    const database = await openDatabase({ databaseUrl: undefined, dataDir: 'memory://', poolSize: 1, logger });
    try {
      expect((await migrate(database.control, dir)).applied.length).toBeGreaterThan(0);
      // A database migrated before checksums were kept: its rows have none, and get today's.
      await sql`update schema_migrations set checksum = null where version = '0002_registry'`.execute(database.control);
      expect((await migrate(database.control, dir)).applied).toEqual([]);
      const adopted = await sql<{
        checksum: string | null;
      }>`select checksum from schema_migrations where version = '0002_registry'`.execute(database.control);
      expect(adopted.rows[0]!.checksum).toMatch(/^[0-9a-f]{64}$/);

      appendFileSync(
        join(dir, '0011_retention.sql'),
        '\nCREATE INDEX IF NOT EXISTS late_addition ON grants (agent_id);\n',
      );
      await expect(migrate(database.control, dir)).rejects.toThrow(MigrationChangedError);
      await expect(migrate(database.control, dir)).rejects.toThrow(
        /migration 0011_retention\.sql was changed after it was applied/,
      );
    } finally {
      await database.close();
    }
  });
});
