import { sql, type Kysely } from 'kysely';
import type { DB } from '../db/schema.js';
import type { Listener } from './listener-bus.js';

/** The tools an agent holds a live grant for (any scope): the only ones its MCP list offers. */
export async function grantedToolIds(
  db: Kysely<DB>,
  agent: { tenantId: string; agentId: string },
  now: Date,
): Promise<ReadonlySet<string>> {
  const rows = await db
    .selectFrom('grants')
    .select('tool_id')
    .distinct()
    .where('tenant_id', '=', agent.tenantId)
    .where('agent_id', '=', agent.agentId)
    .where('revoked_at', 'is', null)
    .where('expires_at', '>', now)
    .execute();
  return new Set(rows.map((row) => row.tool_id));
}

/** Per listener, a stamp of the tools it holds live grants for: a different stamp, a different list. */
export async function grantStamps(
  db: Kysely<DB>,
  listeners: readonly Listener[],
  now: Date,
): Promise<Map<string, string>> {
  const stamps = new Map<string, string>(listeners.map((who) => [listenerKey(who), '']));
  if (listeners.length === 0) return stamps;
  const rows = await db
    .selectFrom('grants')
    .select(['tenant_id', 'agent_id', sql<string>`string_agg(distinct tool_id, ',' order by tool_id)`.as('tools')])
    .where((eb) =>
      eb.or(listeners.map((who) => eb.and([eb('tenant_id', '=', who.tenantId), eb('agent_id', '=', who.agentId)]))),
    )
    .where('revoked_at', 'is', null)
    .where('expires_at', '>', now)
    .groupBy(['tenant_id', 'agent_id'])
    .execute();
  for (const row of rows) stamps.set(listenerKey({ tenantId: row.tenant_id, agentId: row.agent_id }), row.tools);
  return stamps;
}

/** Per tenant with a listener, a stamp of its policy. */
export async function policyStamps(db: Kysely<DB>, tenantIds: readonly string[]): Promise<Map<string, string>> {
  const stamps = new Map<string, string>(tenantIds.map((id) => [id, '']));
  if (tenantIds.length === 0) return stamps;
  const rows = await db
    .selectFrom('tenant_policies')
    .select(['tenant_id', sql<string>`updated_at::text`.as('updated_at')])
    .where('tenant_id', 'in', [...tenantIds])
    .execute();
  for (const row of rows) stamps.set(row.tenant_id, row.updated_at);
  return stamps;
}

export function listenerKey(who: Listener): string {
  return JSON.stringify([who.tenantId, who.agentId]);
}
