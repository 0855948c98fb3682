import { z } from 'zod';
import { identifier } from '../validation/fields.js';

export const OPERATOR_ROLES = ['platform-operator', 'tenant-operator'] as const;
export type OperatorRole = (typeof OPERATOR_ROLES)[number];

/** Who is calling, as proven by a verified token. The tenant comes from here and nowhere else. */
export type Principal =
  | {
      kind: 'agent';
      id: string;
      tenantId: string;
      family: string | undefined;
      scopes: ReadonlySet<string>;
    }
  | {
      kind: 'operator';
      id: string;
      tenantId: string;
      role: OperatorRole;
      scopes: ReadonlySet<string>;
    };

const claimsSchema = z.object({
  sub: identifier,
  tenant_id: identifier,
  kind: z.enum(['agent', 'operator']),
  roles: z.array(z.string()).optional(),
  family: identifier.optional(),
  scope: z.string().max(4096).optional(),
  exp: z.number(),
});

/** Maps verified claims to a principal, or explains why the token cannot be one. */
export function principalFromClaims(
  claims: unknown,
): { ok: true; principal: Principal } | { ok: false; reason: string } {
  const parsed = claimsSchema.safeParse(claims);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    return { ok: false, reason: `claim ${issue?.path.join('.') ?? '?'}: ${issue?.message ?? 'invalid'}` };
  }
  const c = parsed.data;
  const scopes = new Set((c.scope ?? '').split(' ').filter((s) => s.length > 0));
  if (c.kind === 'agent') {
    return { ok: true, principal: { kind: 'agent', id: c.sub, tenantId: c.tenant_id, family: c.family, scopes } };
  }
  // The strongest role wins when a token carries both.
  const role = OPERATOR_ROLES.find((r) => c.roles?.includes(r));
  if (!role) return { ok: false, reason: 'operator token carries no known role' };
  return { ok: true, principal: { kind: 'operator', id: c.sub, tenantId: c.tenant_id, role, scopes } };
}

/** The audit `actor` of a principal: `agent:<id>` or `operator:<id>`. */
export function actorOf(principal: Principal): string {
  return `${principal.kind}:${principal.id}`;
}

/** How far ahead of this clock a token's `iat` may be (the issuer's clock may run a little fast). */
export const MAX_IAT_SKEW_SECONDS = 60;

/**
 * Why a verified token lives too long to accept, or undefined: its lifetime (`exp` minus `iat`,
 * or minus now without an `iat`) must not pass `maxTtlSeconds`, and its `iat` must not be in the
 * future. A stolen token then stays useful for a bounded time only.
 */
export function lifetimeProblem(claims: unknown, nowSeconds: number, maxTtlSeconds: number): string | undefined {
  const { exp, iat } = (claims ?? {}) as { exp?: unknown; iat?: unknown };
  if (typeof exp !== 'number') return 'claim exp: required';
  if (iat !== undefined && (typeof iat !== 'number' || !Number.isFinite(iat))) return 'claim iat: must be a number';
  if (typeof iat === 'number' && iat > nowSeconds + MAX_IAT_SKEW_SECONDS) return 'claim iat: in the future';
  const from = typeof iat === 'number' ? iat : nowSeconds;
  if (exp - from > maxTtlSeconds) return `the token lives longer than ${maxTtlSeconds} s`;
  return undefined;
}

/**
 * Whether two audit actors (`operator:alice`, `agent:x`) are one person where one must differ from
 * the other: identity providers disagree on case, so `OP.T1` and `op.t1` are the same here.
 */
export function sameActor(a: string, b: string): boolean {
  return a.toLowerCase() === b.toLowerCase();
}
