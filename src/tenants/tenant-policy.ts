import type { Kysely } from 'kysely';
import { writeAuditEvents } from '../audit/audit-repository.js';
import type { DB } from '../db/schema.js';

/** A tenant's policy. Deny by default: a tenant never configured has everything off. */
export interface TenantPolicy {
  tenant_id: string;
  external_call_enabled: boolean;
  updated_at: string | null;
  updated_by: string | null;
}

export function defaultPolicy(tenantId: string): TenantPolicy {
  return { tenant_id: tenantId, external_call_enabled: false, updated_at: null, updated_by: null };
}

export async function getTenantPolicy(db: Kysely<DB>, tenantId: string): Promise<TenantPolicy> {
  const row = await db.selectFrom('tenant_policies').selectAll().where('tenant_id', '=', tenantId).executeTakeFirst();
  if (!row) return defaultPolicy(tenantId);
  return { ...row, updated_at: new Date(row.updated_at).toISOString() };
}

/** Replaces a tenant's policy and records the change, old and new, in one transaction. */
export async function putTenantPolicy(
  db: Kysely<DB>,
  change: { tenantId: string; externalCallEnabled: boolean; actor: string; traceId: string; now: Date },
): Promise<TenantPolicy> {
  return db.transaction().execute(async (trx) => {
    const before = await trx
      .selectFrom('tenant_policies')
      .selectAll()
      .where('tenant_id', '=', change.tenantId)
      .forUpdate()
      .executeTakeFirst();
    // Setting what is already set changes nothing, and records nothing.
    if ((before?.external_call_enabled ?? false) === change.externalCallEnabled) {
      return before
        ? { ...before, updated_at: new Date(before.updated_at).toISOString() }
        : defaultPolicy(change.tenantId);
    }
    const row = await trx
      .insertInto('tenant_policies')
      .values({
        tenant_id: change.tenantId,
        external_call_enabled: change.externalCallEnabled,
        updated_at: change.now,
        updated_by: change.actor,
      })
      .onConflict((oc) =>
        oc.column('tenant_id').doUpdateSet({
          external_call_enabled: change.externalCallEnabled,
          updated_at: change.now,
          updated_by: change.actor,
        }),
      )
      .returningAll()
      .executeTakeFirstOrThrow();
    await writeAuditEvents(trx, [
      {
        occurredAt: change.now,
        event: {
          event_type: 'tenant.policy_changed',
          actor: change.actor,
          tenant_id: change.tenantId,
          trace_id: change.traceId,
          status: 'changed',
          details: {
            before: { external_call_enabled: before?.external_call_enabled ?? false },
            after: { external_call_enabled: row.external_call_enabled },
          },
        },
      },
    ]);
    return { ...row, updated_at: new Date(row.updated_at).toISOString() };
  });
}
