import { describe, expect, it } from 'vitest';
import {
  decideKillSwitches,
  switchMatches,
  type ExecutionTarget,
} from '../../src/kill-switches/kill-switch-decision.js';
import {
  KILL_SWITCH_BLAME_RANK,
  KILL_SWITCH_SCOPES,
  type KillSwitch,
  type KillSwitchScope,
} from '../../src/kill-switches/kill-switch.js';

const call: ExecutionTarget = {
  tenantId: 't1',
  agentId: 'veritas.fact-checker',
  family: 'veritas',
  toolId: 'web.fetch',
  target: { family: 'retrieval', provider: 'acme', region: 'eu-west' },
};

const matchingTarget: Record<KillSwitchScope, string> = {
  global: '*',
  region: 'eu-west',
  provider: 'acme',
  tenant: 't1',
  family: 'veritas',
  agent: 'veritas.fact-checker',
  tool: 'web.fetch',
};

let sequence = 0;
function ks(scope: KillSwitchScope, overrides: Partial<KillSwitch> = {}): KillSwitch {
  sequence += 1;
  return {
    id: `ks_${String(sequence).padStart(4, '0')}`,
    scope,
    target: matchingTarget[scope],
    tenant_id: scope === 'tenant' ? 't1' : null,
    reason: `${scope} incident`,
    user_visible_status_copy: `${scope} is paused`,
    safe_degradation_mode_id: null,
    armed_by: { actor_id: 'ops', actor_role: 'platform-operator' },
    armed_at: new Date(Date.UTC(2026, 5, 1, 0, 0, sequence)),
    disarmed_by: null,
    disarmed_at: null,
    disarm_reason: null,
    ...overrides,
  };
}

describe('kill-switch blame order', () => {
  it('is global > region > provider > tenant > family > agent > tool', () => {
    expect(KILL_SWITCH_SCOPES).toEqual(['global', 'region', 'provider', 'tenant', 'family', 'agent', 'tool']);
    const ranks = KILL_SWITCH_SCOPES.map((scope) => KILL_SWITCH_BLAME_RANK[scope]);
    expect(ranks).toEqual([...ranks].sort((a, b) => b - a));
  });

  it('blames the broadest of all matching switches, whatever the order they come in', () => {
    const all = KILL_SWITCH_SCOPES.map((scope) => ks(scope));
    for (let i = 0; i < KILL_SWITCH_SCOPES.length; i += 1) {
      const remaining = all.slice(i).reverse();
      const decision = decideKillSwitches(remaining, call);
      expect(decision.ok).toBe(false);
      if (!decision.ok) {
        expect(decision.blamed.scope).toBe(KILL_SWITCH_SCOPES[i]);
        expect(decision.matches.map((m) => m.scope)).toEqual(KILL_SWITCH_SCOPES.slice(i));
      }
    }
  });

  it('within one scope blames the platform-wide switch over a tenant one, then the first armed', () => {
    const tenantTool = ks('tool', { tenant_id: 't1', armed_at: new Date('2026-01-01T00:00:00Z') });
    const platformTool = ks('tool', { tenant_id: null, armed_at: new Date('2026-02-01T00:00:00Z') });
    expect(decideKillSwitches([tenantTool, platformTool], call)).toMatchObject({
      ok: false,
      blamed: { id: platformTool.id },
    });
    const early = ks('agent', { armed_at: new Date('2026-01-01T00:00:00Z') });
    const late = ks('agent', { armed_at: new Date('2026-03-01T00:00:00Z') });
    expect(decideKillSwitches([late, early], call)).toMatchObject({ ok: false, blamed: { id: early.id } });
  });

  it('admits a call no armed switch matches', () => {
    expect(decideKillSwitches([], call)).toEqual({ ok: true });
    expect(
      decideKillSwitches([ks('tool', { target: 'other.tool' }), ks('region', { target: 'us-east' })], call),
    ).toEqual({ ok: true });
  });
});

describe('which switches match a call', () => {
  it('matches each scope on its own field of the call', () => {
    for (const scope of KILL_SWITCH_SCOPES) {
      expect([scope, switchMatches(ks(scope), call)]).toEqual([scope, true]);
      if (scope !== 'global')
        expect([scope, switchMatches(ks(scope, { target: 'something-else' }), call)]).toEqual([scope, false]);
    }
  });

  it("matches a family switch on the agent's family claim and on the tool target's family", () => {
    expect(switchMatches(ks('family', { target: 'veritas' }), call)).toBe(true);
    expect(switchMatches(ks('family', { target: 'retrieval' }), call)).toBe(true);
    expect(switchMatches(ks('family', { target: 'veritas' }), { ...call, family: undefined })).toBe(false);
  });

  it("confines a tenant's switch to that tenant, and lets a platform-wide one reach every tenant", () => {
    const confined = ks('tool', { tenant_id: 't1' });
    const platformWide = ks('tool', { tenant_id: null });
    expect(switchMatches(confined, call)).toBe(true);
    expect(switchMatches(confined, { ...call, tenantId: 't2' })).toBe(false);
    expect(switchMatches(platformWide, { ...call, tenantId: 't2' })).toBe(true);
    expect(switchMatches(ks('agent', { tenant_id: 't2' }), call)).toBe(false);
  });

  it('matches nothing on a field the call does not carry', () => {
    const bare: ExecutionTarget = { tenantId: 't1' };
    expect(switchMatches(ks('region'), bare)).toBe(false);
    expect(switchMatches(ks('provider'), { ...bare, target: { provider: null } })).toBe(false);
    expect(switchMatches(ks('agent'), bare)).toBe(false);
    expect(switchMatches(ks('tool'), bare)).toBe(false);
    expect(switchMatches(ks('global'), bare)).toBe(true);
  });

  it('ignores disarmed switches', () => {
    const disarmed = ks('global', {
      disarmed_at: new Date(),
      disarmed_by: { actor_id: 'ops', actor_role: 'platform-operator' },
      disarm_reason: 'fixed',
    });
    expect(decideKillSwitches([disarmed], call)).toEqual({ ok: true });
  });
});
