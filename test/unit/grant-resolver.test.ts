import { describe, expect, it } from 'vitest';
import { GRANT_SCOPE_PRIORITY, grantStatus, type Grant, type GrantScope } from '../../src/grants/grant.js';
import { resolveGrant, type RunContext } from '../../src/grants/grant-resolver.js';

const now = new Date('2026-06-23T12:00:00Z');
const minutes = (n: number) => new Date(now.getTime() + n * 60_000);

const context: RunContext = {
  tenant_id: 't1',
  run_id: 'run-1',
  pipeline_instance_id: 'pipe-1',
  session_id: 'sess-1',
  user_id: 'user-1',
};

const refFor: Record<GrantScope, string> = {
  'per-run': 'run-1',
  'per-pipeline-instance': 'pipe-1',
  'per-session': 'sess-1',
  'per-user': 'user-1',
  'per-tenant': 't1',
};

let sequence = 0;
function grant(scope: GrantScope, overrides: Partial<Grant> = {}): Grant {
  sequence += 1;
  return {
    id: `grt_${String(sequence).padStart(4, '0')}`,
    tenant_id: 't1',
    agent_id: 'veritas.fact-checker',
    tool_id: 'web.fetch',
    scope,
    scope_ref: refFor[scope],
    capability_modifiers: {},
    expires_at: minutes(60),
    granted_by: { actor_id: 'op', actor_role: 'tenant-operator' },
    rationale: 'weekly briefing',
    granted_at: minutes(-10),
    revoked_at: null,
    revoked_by: null,
    revocation_reason: null,
    renewed_from: null,
    superseded_by: null,
    ...overrides,
  };
}

const revoked = { revoked_at: minutes(-1), revoked_by: { actor_id: 'op', actor_role: 'tenant-operator' as const } };

describe('resolveGrant: the most specific live grant wins', () => {
  it('ranks the five scopes 100 > 80 > 60 > 40 > 20', () => {
    expect(GRANT_SCOPE_PRIORITY).toEqual({
      'per-run': 100,
      'per-pipeline-instance': 80,
      'per-session': 60,
      'per-user': 40,
      'per-tenant': 20,
    });
  });

  it('picks per-run over every broader scope, whatever the order given', () => {
    const all = (['per-tenant', 'per-user', 'per-run', 'per-session', 'per-pipeline-instance'] as const).map((s) =>
      grant(s),
    );
    const decision = resolveGrant(all, context, now);
    expect(decision.ok && decision.grant.scope).toBe('per-run');
    expect(decision.candidates.map((c) => c.priority)).toEqual([100, 80, 60, 40, 20]);
  });

  it('falls back scope by scope as the more specific ones are removed', () => {
    const order: GrantScope[] = ['per-run', 'per-pipeline-instance', 'per-session', 'per-user', 'per-tenant'];
    for (let i = 0; i < order.length; i += 1) {
      const decision = resolveGrant(
        order.slice(i).map((s) => grant(s)),
        context,
        now,
      );
      expect(decision.ok && decision.grant.scope).toBe(order[i]);
    }
  });

  it('skips a revoked or expired specific grant for a live broader one', () => {
    const decision = resolveGrant(
      [grant('per-run', revoked), grant('per-session', { expires_at: minutes(-1) }), grant('per-tenant')],
      context,
      now,
    );
    expect(decision.ok && decision.grant.scope).toBe('per-tenant');
    expect(decision.candidates.map((c) => c.status)).toEqual(['revoked', 'expired', 'live']);
  });

  it('breaks a tie between grants of one scope in favour of the most recently granted', () => {
    const older = grant('per-user', { granted_at: minutes(-30) });
    const newer = grant('per-user', { granted_at: minutes(-5) });
    const decision = resolveGrant([newer, older], context, now);
    expect(decision.ok && decision.grant.id).toBe(newer.id);
    expect(resolveGrant([older, newer], context, now)).toMatchObject({ ok: true, grant: { id: newer.id } });
  });

  it('breaks an exact tie the same way whatever the input order', () => {
    const a = grant('per-user', { id: 'grt_a', granted_at: minutes(-5) });
    const b = grant('per-user', { id: 'grt_b', granted_at: minutes(-5) });
    const first = resolveGrant([a, b], context, now);
    const second = resolveGrant([b, a], context, now);
    expect(first.ok && first.grant.id).toBe(second.ok && second.grant.id);
  });

  it('treats a grant as expired at its expires_at instant, not after', () => {
    const g = grant('per-run', { expires_at: now });
    expect(resolveGrant([g], context, now)).toMatchObject({ ok: false, code: 'grant_expired' });
    expect(resolveGrant([g], context, new Date(now.getTime() - 1))).toMatchObject({ ok: true });
  });
});

describe('resolveGrant: scope_ref must match the run context', () => {
  it('ignores grants for another run, pipeline, session, user or tenant', () => {
    const others = [
      grant('per-run', { scope_ref: 'run-2' }),
      grant('per-pipeline-instance', { scope_ref: 'pipe-2' }),
      grant('per-session', { scope_ref: 'sess-2' }),
      grant('per-user', { scope_ref: 'user-2' }),
      grant('per-tenant', { scope_ref: 't2', tenant_id: 't2' }),
    ];
    const decision = resolveGrant(others, context, now);
    expect(decision).toEqual({ ok: false, code: 'grant_missing', candidates: [] });
  });

  it('never matches a scope whose key the context lacks', () => {
    const decision = resolveGrant(
      [grant('per-run'), grant('per-session')],
      { tenant_id: 't1', user_id: 'user-1' },
      now,
    );
    expect(decision).toMatchObject({ ok: false, code: 'grant_missing' });
  });

  it('does not let a grant of another tenant apply, even with a matching scope_ref', () => {
    const foreign = grant('per-run', { tenant_id: 't2' });
    expect(resolveGrant([foreign], context, now)).toMatchObject({ ok: false, code: 'grant_missing' });
  });

  it('does not confuse scopes: a per-user grant whose ref equals the run id does not match', () => {
    const confused = grant('per-user', { scope_ref: 'run-1' });
    expect(resolveGrant([confused], context, now)).toMatchObject({ ok: false, code: 'grant_missing' });
  });
});

describe('resolveGrant: typed denials', () => {
  it('says grant_missing when the agent never had a grant', () => {
    expect(resolveGrant([], context, now)).toEqual({ ok: false, code: 'grant_missing', candidates: [] });
  });

  it('says grant_expired when every match lapsed', () => {
    const decision = resolveGrant(
      [grant('per-run', { expires_at: minutes(-1) }), grant('per-tenant', { expires_at: minutes(-2) })],
      context,
      now,
    );
    expect(decision).toMatchObject({ ok: false, code: 'grant_expired' });
    expect(decision.candidates).toHaveLength(2);
  });

  it('says grant_revoked when every match was pulled', () => {
    const decision = resolveGrant([grant('per-run', revoked), grant('per-user', revoked)], context, now);
    expect(decision).toMatchObject({ ok: false, code: 'grant_revoked' });
  });

  it('reports a grant that was revoked and has since expired as revoked', () => {
    const g = grant('per-run', { ...revoked, expires_at: minutes(-1) });
    expect(resolveGrant([g], context, now)).toMatchObject({ ok: false, code: 'grant_revoked' });
  });

  it('on a mix of revoked and expired, reports what happened to the most specific match', () => {
    const mixedA = [grant('per-run', revoked), grant('per-tenant', { expires_at: minutes(-1) })];
    expect(resolveGrant(mixedA, context, now)).toMatchObject({ ok: false, code: 'grant_revoked' });
    const mixedB = [grant('per-run', { expires_at: minutes(-1) }), grant('per-tenant', revoked)];
    expect(resolveGrant(mixedB, context, now)).toMatchObject({ ok: false, code: 'grant_expired' });
  });

  it("treats revocation as final even when revoked_at is ahead of this replica's clock", () => {
    const g = grant('per-run', { revoked_at: minutes(5), revoked_by: revoked.revoked_by });
    expect(grantStatus(g, now)).toBe('revoked');
    expect(resolveGrant([g], context, now)).toMatchObject({ ok: false, code: 'grant_revoked' });
  });
});
