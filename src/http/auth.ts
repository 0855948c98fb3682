import fastifyJwt from '@fastify/jwt';
import fp from 'fastify-plugin';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { AuditLog } from '../audit/audit-log.js';
import { publicKeyFor, type VerificationKeys } from '../auth/jwt-keys.js';
import { actorOf, lifetimeProblem, principalFromClaims, type OperatorRole, type Principal } from '../auth/principal.js';
import { ApiError } from './errors.js';

/**
 * Who may call a route: `operator` unless it says otherwise (deny by default). `public` needs no token, `any` any
 * principal, `operator` a tenant- or platform-operator; `agent` and `platform-operator` only those.
 */
export type Access = 'public' | 'any' | 'agent' | 'operator' | 'platform-operator';

declare module 'fastify' {
  interface FastifyContextConfig {
    access?: Access;
  }
  interface FastifyRequest {
    principal: Principal | undefined;
  }
}

export interface AuthOptions {
  keys: VerificationKeys;
  issuer: string | undefined;
  audience: string | undefined;
  maxTtlSeconds: number;
  audit: AuditLog;
}

/** Verifies bearer tokens and enforces each route's `config.access` before its handler runs. */
export const authPlugin = fp<AuthOptions>(
  async (app: FastifyInstance, options: AuthOptions) => {
    const { keys } = options;
    const verify = {
      algorithms: keys.kind === 'secret' ? ['HS256'] : keys.algorithms,
      // fast-jwt checks iss/aud only when present: when configured, they are required too.
      requiredClaims: ['exp', ...(options.issuer ? ['iss'] : []), ...(options.audience ? ['aud'] : [])],
      ...(options.issuer ? { allowedIss: options.issuer } : {}),
      ...(options.audience ? { allowedAud: options.audience } : {}),
      // Agents send the same token with every call: a verified token is remembered (never past
      // its own expiry) instead of checking its signature again. Keys are fixed at start-up.
      cache: 1000,
      // Every key mode answers the whole token, and `formatUser` keeps its verified claims: a claim
      // named `payload` inside them is just a claim, never read as the claims.
      complete: true,
    };
    const formatUser = (token: { payload: unknown }) => token.payload;
    if (keys.kind === 'secret') {
      await app.register(fastifyJwt, { secret: keys.secret, verify, formatUser } as never);
    } else {
      await app.register(fastifyJwt, {
        formatUser,
        decode: { complete: true },
        secret: {
          public: async (_request: FastifyRequest, token: { header?: { kid?: unknown } }) => {
            const kid = typeof token.header?.kid === 'string' ? token.header.kid : undefined;
            const key = publicKeyFor(keys, kid);
            if (!key) throw new Error('unknown signing key');
            return key;
          },
        },
        verify,
      } as never);
    }

    app.decorateRequest('principal', undefined);

    app.addHook('onRequest', async (request) => {
      const access = request.routeOptions.config?.access ?? (request.routeOptions.url ? 'operator' : 'public');
      if (access === 'public') return;
      request.principal = await authenticate(request, options);
      await authorize(request, request.principal, access, options.audit);
    });
  },
  { name: 'toolgate-auth' },
);

async function authenticate(request: FastifyRequest, options: AuthOptions): Promise<Principal> {
  const header = request.headers.authorization;
  // The scheme is case-insensitive (RFC 9110 §11.1); the token itself is not.
  if (typeof header !== 'string' || !/^Bearer [A-Za-z0-9._~+/=-]+$/i.test(header)) {
    throw new ApiError('unauthenticated', 'a bearer token is required');
  }
  let claims: unknown;
  try {
    claims = await request.jwtVerify();
  } catch {
    // The reason (expired, bad signature, wrong audience…) stays in our logs, not the response.
    throw new ApiError('unauthenticated', 'the bearer token is not valid');
  }
  // The wall clock, as fast-jwt's own `exp` and `nbf` checks use.
  const tooLong = lifetimeProblem(claims, Math.floor(Date.now() / 1000), options.maxTtlSeconds);
  if (tooLong) throw new ApiError('unauthenticated', `the bearer token is not valid: ${tooLong}`);
  const result = principalFromClaims(claims);
  if (!result.ok) throw new ApiError('unauthenticated', `the bearer token is not valid: ${result.reason}`);
  return result.principal;
}

async function authorize(
  request: FastifyRequest,
  principal: Principal,
  access: Access,
  audit: AuditLog,
): Promise<void> {
  if (access === 'any') return;
  if (access === 'agent') {
    if (principal.kind !== 'agent') throw new ApiError('forbidden', 'this route is for agents');
    return;
  }
  if (principal.kind === 'agent') {
    await audit.append({
      event_type: 'security.escalation_attempt',
      actor: actorOf(principal),
      tenant_id: principal.tenantId,
      agent_id: principal.id,
      trace_id: request.traceId,
      status: 'denied',
      reason_code: 'agent_forbidden',
      details: { method: request.method, route: request.routeOptions.url ?? request.url, required: access },
    });
    throw new ApiError('agent_forbidden', 'agents may not use operator routes');
  }
  if (access === 'platform-operator' && principal.role !== 'platform-operator') {
    // A tenant-operator reaching for platform powers is a security event too.
    await audit.append({
      event_type: 'security.escalation_attempt',
      actor: actorOf(principal),
      tenant_id: principal.tenantId,
      trace_id: request.traceId,
      status: 'denied',
      reason_code: 'forbidden',
      details: {
        method: request.method,
        route: request.routeOptions.url ?? request.url,
        required: access,
        actor_role: principal.role,
      },
    });
    throw new ApiError('forbidden', 'this route needs the platform-operator role');
  }
}

/** The authenticated principal of a route that is not public. */
export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new Error('principalOf called on a public route');
  return request.principal;
}

/** Operators only: narrows the principal's type for handlers of operator routes. */
export function operatorOf(request: FastifyRequest): Extract<Principal, { kind: 'operator' }> & { role: OperatorRole } {
  const principal = principalOf(request);
  if (principal.kind !== 'operator') throw new Error('operatorOf called on a route open to agents');
  return principal;
}
