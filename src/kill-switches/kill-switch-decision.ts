import { KILL_SWITCH_BLAME_RANK, type KillSwitch } from './kill-switch.js';

/**
 * What a call is about to touch, as kill switches see it. `target` is the tool contract's
 * server-side `{family, provider, region}` (never taken from a request). Absent fields match
 * no switch of their scope.
 */
export interface ExecutionTarget {
  tenantId: string;
  agentId?: string | undefined;
  /** The agent's `family` claim. */
  family?: string | undefined;
  toolId?: string | undefined;
  target?:
    | {
        family?: string | null | undefined;
        provider?: string | null | undefined;
        region?: string | null | undefined;
      }
    | null
    | undefined;
}

export type KillSwitchDecision =
  { ok: true } | { ok: false; code: 'kill_switch_active'; blamed: KillSwitch; matches: KillSwitch[] };

/**
 * Whether an armed switch stops a call. A switch with a tenant only touches that tenant's calls.
 * A `family` switch stops calls by agents of that family (their claim) and calls to tools of that
 * target family — either suffices: switches only ever tighten, so when in doubt one matches more.
 */
export function switchMatches(ks: KillSwitch, call: ExecutionTarget): boolean {
  if (ks.disarmed_at !== null) return false;
  if (ks.tenant_id !== null && ks.tenant_id !== call.tenantId) return false;
  switch (ks.scope) {
    case 'global':
      return true;
    case 'region':
      return call.target?.region === ks.target;
    case 'provider':
      return call.target?.provider === ks.target;
    case 'tenant':
      return call.tenantId === ks.target;
    case 'family':
      return call.family === ks.target || call.target?.family === ks.target;
    case 'agent':
      return call.agentId === ks.target;
    case 'tool':
      return call.toolId === ks.target;
    default: {
      const unreachable: never = ks.scope;
      throw new Error(`unknown kill-switch scope ${String(unreachable)}`);
    }
  }
}

/**
 * Every armed switch matching the call, the broadest blamed (global > region >
 * provider > tenant > family > agent > tool). Among switches of one scope the platform-wide one
 * is blamed before a tenant's, then the earliest armed — the one that tripped first.
 */
export function decideKillSwitches(switches: Iterable<KillSwitch>, call: ExecutionTarget): KillSwitchDecision {
  const matches: KillSwitch[] = [];
  for (const ks of switches) if (switchMatches(ks, call)) matches.push(ks);
  if (matches.length === 0) return { ok: true };
  matches.sort(blameFirst);
  return { ok: false, code: 'kill_switch_active', blamed: matches[0]!, matches };
}

function blameFirst(a: KillSwitch, b: KillSwitch): number {
  const rank = KILL_SWITCH_BLAME_RANK[b.scope] - KILL_SWITCH_BLAME_RANK[a.scope];
  if (rank !== 0) return rank;
  const platformWide = Number(b.tenant_id === null) - Number(a.tenant_id === null);
  if (platformWide !== 0) return platformWide;
  const age = a.armed_at.getTime() - b.armed_at.getTime();
  if (age !== 0) return age;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}
