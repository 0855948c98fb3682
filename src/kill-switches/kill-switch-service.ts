import { randomBytes } from 'node:crypto';
import type { Transaction } from 'kysely';
import { writeAuditEvents } from '../audit/audit-repository.js';
import type { DB } from '../db/schema.js';
import {
  GLOBAL_TARGET,
  PLATFORM_ONLY_SCOPES,
  type KillSwitch,
  type KillSwitchActor,
  type KillSwitchScope,
} from './kill-switch.js';
import {
  armKillSwitch,
  disarmKillSwitch,
  findKillSwitch,
  listKillSwitches,
  type KillSwitchQuery,
} from './kill-switch-repository.js';
import type { KillSwitchSnapshot } from './kill-switch-snapshot.js';
import type { Database } from '../db/database.js';

/** A switch as an operator asks for it. */
export interface ArmRequest {
  actor: KillSwitchActor;
  scope: KillSwitchScope;
  target: string;
  /** null: platform-wide. Who may ask for what is checked here, whatever the route did. */
  tenantId: string | null;
  reason: string;
  userVisibleStatusCopy: string;
  safeDegradationModeId: string | null;
  traceId?: string | undefined;
}

/**
 * What else happens in the transaction that arms a switch: the open runs it stops
 * (docs/api.md#approvals-hand-offs-and-run-controls, cascades). The runs room provides it.
 */
export type KillSwitchArmedHook = (
  trx: Transaction<DB>,
  armed: KillSwitch,
  cause: { actor: string; traceId?: string | null | undefined },
  at: Date,
) => Promise<void>;

/** Why an arm or disarm was refused; expected outcomes, not faults. */
export type KillSwitchRefusal = {
  ok: false;
  code: 'forbidden' | 'invalid_request' | 'not_found';
  message: string;
  details?: Record<string, unknown>;
};

/**
 * Arming and disarming. Each change and its audit event commit in one transaction;
 * the database trigger then announces it to every replica's snapshot.
 */
export class KillSwitchService {
  constructor(
    private readonly database: Database,
    private readonly snapshot: KillSwitchSnapshot,
    private readonly now: () => Date,
    private readonly onArmed?: KillSwitchArmedHook,
  ) {}

  /**
   * Arms a switch, or returns the one already armed on the same target (`created: false`,
   * nothing recorded). Platform-wide switches and the `global`, `region` and `provider` scopes
   * are the platform-operator's alone.
   */
  async arm(request: ArmRequest): Promise<{ ok: true; created: boolean; killSwitch: KillSwitch } | KillSwitchRefusal> {
    const refusal = checkArm(request);
    if (refusal) return refusal;
    const armedAt = this.now();
    const result = await this.database.control.transaction().execute(async (trx) => {
      const armed = await armKillSwitch(trx, {
        id: `ks_${randomBytes(10).toString('hex')}`,
        scope: request.scope,
        target: request.target,
        tenant_id: request.tenantId,
        reason: request.reason,
        user_visible_status_copy: request.userVisibleStatusCopy,
        safe_degradation_mode_id: request.safeDegradationModeId,
        armed_by: request.actor,
        armed_at: armedAt,
      });
      if (armed.created) {
        await writeAuditEvents(trx, [
          {
            occurredAt: armedAt,
            event: {
              event_type: 'kill_switch.armed',
              actor: `operator:${request.actor.actor_id}`,
              tenant_id: request.tenantId,
              ...targetColumns(request.scope, request.target),
              trace_id: request.traceId ?? null,
              status: 'armed',
              details: {
                kill_switch_id: armed.killSwitch.id,
                scope: request.scope,
                target: request.target,
                platform_wide: request.tenantId === null,
                reason: request.reason,
                user_visible_status_copy: request.userVisibleStatusCopy,
                safe_degradation_mode_id: request.safeDegradationModeId,
                actor_role: request.actor.actor_role,
              },
            },
          },
        ]);
        await this.onArmed?.(
          trx,
          armed.killSwitch,
          { actor: `operator:${request.actor.actor_id}`, traceId: request.traceId },
          armedAt,
        );
      }
      return armed;
    });
    await this.settleLocally();
    return { ok: true, ...result };
  }

  /**
   * Disarms a switch. Disarming one that is already disarmed changes and records nothing and
   * returns it as it is. A tenant-operator cannot disarm a platform-wide switch.
   */
  async disarm(request: {
    actor: KillSwitchActor;
    id: string;
    reason: string;
    traceId?: string | undefined;
  }): Promise<{ ok: true; changed: boolean; killSwitch: KillSwitch } | KillSwitchRefusal> {
    const current = await findKillSwitch(this.database.control, request.id);
    if (!current) return { ok: false, code: 'not_found', message: `kill switch ${request.id} not found` };
    if (current.tenant_id === null && request.actor.actor_role !== 'platform-operator') {
      return { ok: false, code: 'forbidden', message: 'only a platform-operator disarms a platform-wide switch' };
    }
    const at = this.now();
    const disarmed = await this.database.control.transaction().execute(async (trx) => {
      const changed = await disarmKillSwitch(trx, request.id, request.actor, request.reason, at);
      if (!changed) return undefined;
      await writeAuditEvents(trx, [
        {
          occurredAt: at,
          event: {
            event_type: 'kill_switch.disarmed',
            actor: `operator:${request.actor.actor_id}`,
            tenant_id: changed.tenant_id,
            ...targetColumns(changed.scope, changed.target),
            trace_id: request.traceId ?? null,
            status: 'disarmed',
            details: {
              kill_switch_id: changed.id,
              scope: changed.scope,
              target: changed.target,
              platform_wide: changed.tenant_id === null,
              reason: request.reason,
              armed_at: changed.armed_at.toISOString(),
              actor_role: request.actor.actor_role,
            },
          },
        },
      ]);
      return changed;
    });
    if (!disarmed) {
      const unchanged = await findKillSwitch(this.database.control, request.id);
      return { ok: true, changed: false, killSwitch: unchanged ?? current };
    }
    await this.settleLocally();
    return { ok: true, changed: true, killSwitch: disarmed };
  }

  get(id: string): Promise<KillSwitch | undefined> {
    return findKillSwitch(this.database.control, id);
  }

  list(query: KillSwitchQuery): ReturnType<typeof listKillSwitches> {
    return listKillSwitches(this.database.control, query);
  }

  // The replica that made the change answers only once its own snapshot shows it. If that read
  // fails the change still stands (it is committed); the periodic check will pick it up.
  private async settleLocally(): Promise<void> {
    await this.snapshot.refresh().catch(() => undefined);
  }
}

function checkArm(request: ArmRequest): KillSwitchRefusal | undefined {
  const platform = request.actor.actor_role === 'platform-operator';
  if (PLATFORM_ONLY_SCOPES.has(request.scope)) {
    if (!platform) {
      return { ok: false, code: 'forbidden', message: `only a platform-operator arms ${request.scope} switches` };
    }
    if (request.tenantId !== null) {
      return invalid('body.tenant_id', `a ${request.scope} switch is platform-wide and takes no tenant_id`);
    }
  } else if (request.tenantId === null && !platform) {
    return { ok: false, code: 'forbidden', message: 'only a platform-operator arms platform-wide switches' };
  }
  if (request.scope === 'global' && request.target !== GLOBAL_TARGET) {
    return invalid('body.target', `a global switch targets "${GLOBAL_TARGET}"`);
  }
  if (request.scope === 'tenant' && request.tenantId !== request.target) {
    return invalid('body.tenant_id', 'a tenant switch targets its own tenant');
  }
  return undefined;
}

/**
 * The audit columns an agent or tool switch names its target in, so that `GET /audit?agent_id=`
 * and `?tool_id=` find it; other scopes' targets are no agent or tool, and stay in `details`.
 */
function targetColumns(scope: KillSwitchScope, target: string): { agent_id?: string; tool_id?: string } {
  if (scope === 'agent') return { agent_id: target };
  if (scope === 'tool') return { tool_id: target };
  return {};
}

function invalid(field: string, message: string): KillSwitchRefusal {
  return {
    ok: false,
    code: 'invalid_request',
    message: `${field}: ${message}`,
    details: { issues: [{ field, message }] },
  };
}
