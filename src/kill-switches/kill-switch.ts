import type { OperatorRole } from '../auth/principal.js';

/** The kill-switch scopes in blame order, the broadest first (docs/api.md#grants-and-kill-switches). */
export const KILL_SWITCH_SCOPES = ['global', 'region', 'provider', 'tenant', 'family', 'agent', 'tool'] as const;
export type KillSwitchScope = (typeof KILL_SWITCH_SCOPES)[number];

/** Blame rank: when several switches match, the one with the highest rank speaks to the user. */
export const KILL_SWITCH_BLAME_RANK: Readonly<Record<KillSwitchScope, number>> = {
  global: 6,
  region: 5,
  provider: 4,
  tenant: 3,
  family: 2,
  agent: 1,
  tool: 0,
};

/** Scopes only a platform-operator arms; they are always platform-wide (no tenant). */
export const PLATFORM_ONLY_SCOPES: ReadonlySet<KillSwitchScope> = new Set(['global', 'region', 'provider']);

/** The target of a `global` switch: it matches everything. */
export const GLOBAL_TARGET = '*';

/** The operator who armed or disarmed a switch. */
export interface KillSwitchActor {
  actor_id: string;
  actor_role: OperatorRole;
}

/**
 * A kill switch. `tenant_id` null means platform-wide; otherwise the switch only matches calls of
 * that tenant. `target` is what the scope compares: a region, provider, tenant id, family, agent
 * id or tool id (`*` for global).
 */
export interface KillSwitch {
  id: string;
  scope: KillSwitchScope;
  target: string;
  tenant_id: string | null;
  reason: string;
  user_visible_status_copy: string;
  safe_degradation_mode_id: string | null;
  armed_by: KillSwitchActor;
  armed_at: Date;
  disarmed_by: KillSwitchActor | null;
  disarmed_at: Date | null;
  disarm_reason: string | null;
}
