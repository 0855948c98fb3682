import { sql, type Kysely, type Selectable, type Transaction } from 'kysely';
import type { DB, ToolVersionTable } from '../db/schema.js';
import type { ToolContent, ToolContract, ToolDeprecation } from './tool-contract.js';

/** The PostgreSQL channel every registry change is announced on; the payload is the new revision. */
export const REGISTRY_CHANNEL = 'toolgate_registry';

/** A stored version: the contract plus what idempotency and catch-up need. */
export interface StoredToolVersion {
  tool: ToolContract;
  contentSha256: string;
  revision: number;
}

/**
 * Locks the registry for one change and returns its current revision. Every writer takes this
 * lock, so changes commit one at a time and revisions become visible in order.
 */
export async function lockRegistry(trx: Transaction<DB>): Promise<number> {
  const row = await trx
    .selectFrom('registry_revision')
    .select('revision')
    .where('id', '=', 1)
    .forUpdate()
    .executeTakeFirstOrThrow();
  return Number(row.revision);
}

/** Records the new revision and announces it; the notification is delivered at commit. */
export async function advanceRevision(trx: Transaction<DB>, revision: number): Promise<void> {
  await trx.updateTable('registry_revision').set({ revision }).where('id', '=', 1).execute();
  await sql`select pg_notify(${REGISTRY_CHANNEL}, ${String(revision)})`.execute(trx);
}

export async function findToolVersion(
  db: Kysely<DB> | Transaction<DB>,
  toolId: string,
  version: string,
): Promise<StoredToolVersion | undefined> {
  const row = await db
    .selectFrom('tool_versions')
    .selectAll()
    .where('tool_id', '=', toolId)
    .where('version', '=', version)
    .executeTakeFirst();
  return row ? toStored(row) : undefined;
}

/** Every version of the given tools. */
export async function findVersionsOf(
  db: Kysely<DB> | Transaction<DB>,
  toolIds: readonly string[],
): Promise<StoredToolVersion[]> {
  if (toolIds.length === 0) return [];
  const rows = await db
    .selectFrom('tool_versions')
    .selectAll()
    .where('tool_id', 'in', [...toolIds])
    .execute();
  return rows.map(toStored);
}

/** Every registered tool id (registration compares a new id's MCP name with theirs). */
export async function listToolIds(db: Kysely<DB> | Transaction<DB>): Promise<string[]> {
  const rows = await db.selectFrom('tool_versions').select('tool_id').distinct().execute();
  return rows.map((row) => row.tool_id);
}

export async function toolExists(db: Kysely<DB> | Transaction<DB>, toolId: string): Promise<boolean> {
  const row = await db
    .selectFrom('tool_versions')
    .select('tool_id')
    .where('tool_id', '=', toolId)
    .limit(1)
    .executeTakeFirst();
  return row !== undefined;
}

export async function insertToolVersion(
  trx: Transaction<DB>,
  version: {
    content: ToolContent;
    contentSha256: string;
    deprecation: ToolDeprecation | null;
    registeredAt: Date;
    registeredBy: string;
    revision: number;
  },
): Promise<StoredToolVersion> {
  const row = await trx
    .insertInto('tool_versions')
    .values({
      tool_id: version.content.id,
      version: version.content.version,
      contract: JSON.stringify(version.content),
      content_sha256: version.contentSha256,
      deprecated_at: version.deprecation ? new Date(version.deprecation.deprecated_at) : null,
      replacement_tool_id: version.deprecation?.replacement_tool_id ?? null,
      registered_at: version.registeredAt,
      registered_by: version.registeredBy,
      revision: version.revision,
    })
    .returningAll()
    .executeTakeFirstOrThrow();
  return toStored(row);
}

export async function setDeprecation(
  trx: Transaction<DB>,
  change: { toolId: string; version: string; deprecation: ToolDeprecation; revision: number },
): Promise<StoredToolVersion> {
  const row = await trx
    .updateTable('tool_versions')
    .set({
      deprecated_at: new Date(change.deprecation.deprecated_at),
      replacement_tool_id: change.deprecation.replacement_tool_id,
      revision: change.revision,
    })
    .where('tool_id', '=', change.toolId)
    .where('version', '=', change.version)
    .returningAll()
    .executeTakeFirstOrThrow();
  return toStored(row);
}

/**
 * The registry's revision and every version changed after `knownRevision`, read in one
 * statement (one snapshot), so the rows are exactly those up to the revision returned.
 */
export async function loadChangesSince(
  db: Kysely<DB>,
  knownRevision: number,
): Promise<{ revision: number; changed: StoredToolVersion[] }> {
  const rows = await db
    .selectFrom('registry_revision as r')
    .leftJoin('tool_versions as t', (join) =>
      join.on('t.revision', '>', knownRevision).onRef('t.revision', '<=', 'r.revision'),
    )
    .select([
      'r.revision as head',
      't.tool_id',
      't.version',
      't.contract',
      't.content_sha256',
      't.deprecated_at',
      't.replacement_tool_id',
      't.registered_at',
      't.registered_by',
      't.revision',
    ])
    .where('r.id', '=', 1)
    .execute();
  const head = rows[0] ? Number(rows[0].head) : 0;
  const changed = rows
    .filter((row) => row.tool_id !== null)
    .map((row) => toStored(row as Selectable<ToolVersionTable>));
  return { revision: head, changed };
}

function toStored(row: Selectable<ToolVersionTable>): StoredToolVersion {
  const content = (typeof row.contract === 'string' ? JSON.parse(row.contract) : row.contract) as ToolContent;
  const tool: ToolContract = {
    ...content,
    deprecation:
      row.deprecated_at === null
        ? null
        : { deprecated_at: new Date(row.deprecated_at).toISOString(), replacement_tool_id: row.replacement_tool_id },
    registered_at: new Date(row.registered_at).toISOString(),
    registered_by: row.registered_by,
  };
  return { tool, contentSha256: row.content_sha256, revision: Number(row.revision) };
}
