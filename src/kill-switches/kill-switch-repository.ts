import { sql, type Kysely, type Selectable } from 'kysely';
import type { OperatorRole } from '../auth/principal.js';
import type { DB, KillSwitchTable } from '../db/schema.js';
import type { KillSwitch, KillSwitchActor, KillSwitchScope } from './kill-switch.js';
import type { BeforeChain } from '../db/lock-order.js';

/** The channel the database announces kill-switch changes on (see migration 0003's trigger). */
export const KILL_SWITCH_CHANNEL = 'toolgate_kill_switches';

/** A switch as it is armed: everything but its disarming. */
export type NewKillSwitch = Omit<KillSwitch, 'disarmed_by' | 'disarmed_at' | 'disarm_reason'>;

/**
 * Inserts an armed switch unless one is already armed on the same (scope, target, tenant), which
 * it then returns instead: the unique index decides, so two replicas arming at once agree.
 */
export async function armKillSwitch(
  trx: BeforeChain,
  ks: NewKillSwitch,
): Promise<{ created: boolean; killSwitch: KillSwitch }> {
  // The armed twin found by the conflict may be disarmed before we read it: then try again.
  for (let attempt = 0; ; attempt += 1) {
    const inserted = await trx
      .insertInto('kill_switches')
      .values({
        id: ks.id,
        scope: ks.scope,
        target: ks.target,
        tenant_id: ks.tenant_id,
        reason: ks.reason,
        user_visible_status_copy: ks.user_visible_status_copy,
        safe_degradation_mode_id: ks.safe_degradation_mode_id,
        armed_by_actor_id: ks.armed_by.actor_id,
        armed_by_actor_role: ks.armed_by.actor_role,
        armed_at: ks.armed_at,
      })
      .onConflict((oc) => oc.doNothing())
      .returningAll()
      .executeTakeFirst();
    if (inserted) return { created: true, killSwitch: toKillSwitch(inserted) };
    const existing = await trx
      .selectFrom('kill_switches')
      .selectAll()
      .where('scope', '=', ks.scope)
      .where('target', '=', ks.target)
      .where(sql<string>`coalesce(tenant_id, '')`, '=', ks.tenant_id ?? '')
      .where('disarmed_at', 'is', null)
      .executeTakeFirst();
    if (existing) return { created: false, killSwitch: toKillSwitch(existing) };
    if (attempt >= 2) throw new Error(`kill switch ${ks.scope}:${ks.target} neither inserted nor found armed`);
  }
}

/** Disarms an armed switch; undefined when it was not armed (already disarmed, or unknown). */
export async function disarmKillSwitch(
  trx: BeforeChain,
  id: string,
  by: KillSwitchActor,
  reason: string,
  at: Date,
): Promise<KillSwitch | undefined> {
  const row = await trx
    .updateTable('kill_switches')
    .set({
      disarmed_at: at,
      disarmed_by_actor_id: by.actor_id,
      disarmed_by_actor_role: by.actor_role,
      disarm_reason: reason,
    })
    .where('id', '=', id)
    .where('disarmed_at', 'is', null)
    .returningAll()
    .executeTakeFirst();
  return row ? toKillSwitch(row) : undefined;
}

/** One switch by id, armed or not. */
export async function findKillSwitch(db: Kysely<DB>, id: string): Promise<KillSwitch | undefined> {
  const row = await db.selectFrom('kill_switches').selectAll().where('id', '=', id).executeTakeFirst();
  return row ? toKillSwitch(row) : undefined;
}

/** Filters of `GET /kill-switches`. */
export interface KillSwitchQuery {
  /** Only switches of this tenant; with `includePlatformWide`, also the platform-wide ones. */
  tenantId?: string | undefined;
  includePlatformWide?: boolean;
  state?: 'armed' | 'disarmed' | undefined;
  scope?: KillSwitchScope | undefined;
  target?: string | undefined;
  /** Continue after this (armed_at, id), the last item of the previous page. */
  after?: { armedAt: Date; id: string } | undefined;
  limit: number;
}

/** Newest armed first, one page; `next` continues the listing when more remain. */
export async function listKillSwitches(
  db: Kysely<DB>,
  query: KillSwitchQuery,
): Promise<{ items: KillSwitch[]; next: { armedAt: Date; id: string } | null }> {
  let q = db.selectFrom('kill_switches').selectAll();
  if (query.tenantId !== undefined) {
    const tenantId = query.tenantId;
    q = query.includePlatformWide
      ? q.where((eb) => eb.or([eb('tenant_id', '=', tenantId), eb('tenant_id', 'is', null)]))
      : q.where('tenant_id', '=', tenantId);
  }
  if (query.state === 'armed') q = q.where('disarmed_at', 'is', null);
  if (query.state === 'disarmed') q = q.where('disarmed_at', 'is not', null);
  if (query.scope !== undefined) q = q.where('scope', '=', query.scope);
  if (query.target !== undefined) q = q.where('target', '=', query.target);
  if (query.after !== undefined) {
    const { armedAt, id } = query.after;
    q = q.where((eb) =>
      eb.or([eb('armed_at', '<', armedAt), eb.and([eb('armed_at', '=', armedAt), eb('id', '<', id)])]),
    );
  }
  const rows = await q
    .orderBy('armed_at', 'desc')
    .orderBy('id', 'desc')
    .limit(query.limit + 1)
    .execute();
  const items = rows.slice(0, query.limit).map(toKillSwitch);
  const last = items[items.length - 1];
  return { items, next: rows.length > query.limit && last ? { armedAt: last.armed_at, id: last.id } : null };
}

/** The version every replica compares its snapshot with. */
export async function readKillSwitchVersion(db: Kysely<DB>): Promise<number> {
  const row = await db.selectFrom('kill_switch_state').select('version').where('id', '=', 1).executeTakeFirstOrThrow();
  return Number(row.version);
}

/**
 * Every armed switch and the version they make up, read by one statement so the two agree
 * (a switch armed meanwhile is either in both or in neither).
 */
export async function readArmedKillSwitches(db: Kysely<DB>): Promise<{ version: number; switches: KillSwitch[] }> {
  const result = await sql<Selectable<KillSwitchTable> & { state_version: number | string }>`
    select s.version as state_version, k.*
    from kill_switch_state s
    left join kill_switches k on k.disarmed_at is null
    where s.id = 1`.execute(db);
  const first = result.rows[0];
  if (!first) throw new Error('kill_switch_state has no row: migration 0003 not applied');
  const switches = result.rows.filter((row) => row.id !== null).map(toKillSwitch);
  return { version: Number(first.state_version), switches };
}

function toKillSwitch(row: Selectable<KillSwitchTable>): KillSwitch {
  return {
    id: row.id,
    scope: row.scope as KillSwitchScope,
    target: row.target,
    tenant_id: row.tenant_id,
    reason: row.reason,
    user_visible_status_copy: row.user_visible_status_copy,
    safe_degradation_mode_id: row.safe_degradation_mode_id,
    armed_by: { actor_id: row.armed_by_actor_id, actor_role: row.armed_by_actor_role as OperatorRole },
    armed_at: new Date(row.armed_at),
    disarmed_by:
      row.disarmed_by_actor_id === null
        ? null
        : { actor_id: row.disarmed_by_actor_id, actor_role: row.disarmed_by_actor_role as OperatorRole },
    disarmed_at: row.disarmed_at === null ? null : new Date(row.disarmed_at),
    disarm_reason: row.disarm_reason,
  };
}
