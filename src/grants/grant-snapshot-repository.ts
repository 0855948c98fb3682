import { sql, type Kysely, type RawBuilder, type Selectable } from 'kysely';
import type { DB, GrantTable } from '../db/schema.js';
import type { Grant } from './grant.js';
import { toGrant } from './grant-repository.js';

/** The channel the database announces grant changes on (see migration 0015's trigger). */
export const GRANT_CHANNEL = 'toolgate_grants';

/** A grant with the version of its last change (creation or revocation). */
export interface VersionedGrant extends Grant {
  version: number;
}

/** The grants version: every creation and revocation raises it by one, in commit order. */
export async function readGrantVersion(db: Kysely<DB>): Promise<number> {
  const row = await db.selectFrom('grant_state').select('version').where('id', '=', 1).executeTakeFirstOrThrow();
  return Number(row.version);
}

/**
 * The version and, read by the same statement so the two agree, either the grants changed since
 * `since` (revoked ones included, so that a copy can drop them) or, with no `since`, every grant
 * neither revoked nor expired at `now`.
 */
export async function readGrantChanges(
  db: Kysely<DB>,
  from: { since: number } | { now: Date },
): Promise<{ version: number; grants: VersionedGrant[] }> {
  const which =
    'since' in from
      ? sql`g.version > ${from.since}`
      : sql`g.revoked_at is null and g.expires_at > ${from.now}::timestamptz`;
  const result = await sql<Selectable<GrantTable> & { state_version: number | string }>`
    select s.version as state_version, g.*
    from grant_state s
    left join grants g on ${which}
    where s.id = 1`.execute(db);
  const first = result.rows[0];
  if (!first) throw new Error('grant_state has no row: migration 0015 not applied');
  const grants = result.rows
    .filter((row) => row.id !== null)
    .map((row) => ({ ...toGrant(row), version: Number(row.version) }));
  return { version: Number(first.state_version), grants };
}

/**
 * That a run relies on a grant. With `since`, the grant was chosen from a copy of the grants at
 * that version, on `decidedAt`: the use is recorded only if that choice still stands.
 */
export interface GrantUseIf {
  tenant_id: string;
  run_id: string;
  grant_id: string;
  assumed?: { agent_id: string; tool_id: string; since: number; decided_at: Date } | undefined;
}

/**
 * Records grant uses in one statement, each only if its grant is live (share-locked: a revocation comes first or stops
 * these runs) and, when decided from the copy, still as decided: docs/design/replica-snapshots.md#grants.
 */
export async function recordGrantUsesIf(db: Kysely<DB>, uses: GrantUseIf[]): Promise<boolean[]> {
  if (uses.length === 0) return [];
  const result = await sql<{
    ord: number | string;
  }>`with ${grantUseSteps(uses)} select ord from grant_uses_standing`.execute(db);
  const recorded = new Set(result.rows.map((row) => Number(row.ord)));
  return uses.map((_, index) => recorded.has(index + 1));
}

/**
 * `recordGrantUsesIf` as common table expressions another statement joins (a run's claim records
 * the use its first call was decided on): `grant_uses_standing` holds the uses recorded, by `ord`
 * (1-based), `tenant_id` and `run_id`. `runs`, when given, names the CTE of the runs they may be for.
 */
export function grantUseSteps(uses: GrantUseIf[], runs?: string): RawBuilder<unknown> {
  const forRuns = runs
    ? sql`where exists (select 1 from ${sql.table(runs)} r where r.tenant_id = w.tenant_id and r.run_id = w.run_id)`
    : sql``;
  return sql`grant_uses_wanted as (
      select * from unnest(
        ${uses.map((u) => u.grant_id)}::text[],
        ${uses.map((u) => u.tenant_id)}::text[],
        ${uses.map((u) => u.run_id)}::text[],
        ${uses.map((u) => u.assumed?.agent_id ?? null)}::text[],
        ${uses.map((u) => u.assumed?.tool_id ?? null)}::text[],
        ${uses.map((u) => u.assumed?.since ?? null)}::bigint[],
        ${uses.map((u) => u.assumed?.decided_at.toISOString() ?? null)}::timestamptz[]
      ) with ordinality as w(grant_id, tenant_id, run_id, agent_id, tool_id, since, decided_at, ord)
      ${forRuns}
    ), grant_uses_live as (
      select id, expires_at from grants
      where id = any(${[...new Set(uses.map((u) => u.grant_id))]}::text[]) and revoked_at is null
      order by id for share
    ), grant_uses_standing as (
      select w.ord, w.grant_id, w.tenant_id, w.run_id from grant_uses_wanted w join grant_uses_live l on l.id = w.grant_id
      where ${asDecided(sql`l`, sql`w`)}
    ), grant_uses_written as (
      insert into run_grant_uses (grant_id, tenant_id, run_id)
      select distinct grant_id, tenant_id, run_id from grant_uses_standing
      order by tenant_id, run_id, grant_id
      on conflict do nothing
      returning 1
    )`;
}

/**
 * Whether the live grant `l` is still the one a decision from the copy chose (`w`: tenant_id, agent_id, tool_id, since,
 * decided_at; a null `since` was not decided from the copy): unexpired then, and no newer version of it since.
 */
function asDecided(l: RawBuilder<unknown>, w: RawBuilder<unknown>): RawBuilder<boolean> {
  return sql<boolean>`(${w}.since is null or (
        ${l}.expires_at > ${w}.decided_at
        and not exists (
          select 1 from grants c
          where c.tenant_id = ${w}.tenant_id and c.agent_id = ${w}.agent_id and c.tool_id = ${w}.tool_id
            and c.version > ${w}.since)))`;
}

/**
 * Whether a grant a refusal was decided on from the copy still stands as decided, as SQL over `w` (grant_id and
 * `asDecided`'s columns): a refusal recorded without a grant use rests on it as a use would.
 */
export function grantStandsAsDecided(w: RawBuilder<unknown>): RawBuilder<boolean> {
  return sql<boolean>`exists (
    select 1 from grants l where l.id = ${w}.grant_id and l.revoked_at is null and ${asDecided(sql`l`, w)})`;
}

/**
 * Whether no grant at all, live or not, exists for an agent and a tool in a tenant: the exact answer
 * a refusal decided from this replica's copy (it held none) rests on, as SQL another statement joins.
 */
export function noGrantAtAll(
  tenantId: RawBuilder<unknown>,
  agentId: RawBuilder<unknown>,
  toolId: RawBuilder<unknown>,
): RawBuilder<boolean> {
  return sql<boolean>`not exists (
    select 1 from grants g where g.tenant_id = ${tenantId} and g.agent_id = ${agentId} and g.tool_id = ${toolId})`;
}
