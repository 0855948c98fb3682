import { randomUUID } from 'node:crypto';
import { createSigner } from 'fast-jwt';
import type { OperatorRole } from './principal.js';

export interface TokenRequest {
  kind: 'agent' | 'operator';
  sub: string;
  tenantId: string;
  role?: OperatorRole;
  family?: string;
  scope?: string;
  ttlSeconds: number;
  issuer?: string;
  audience?: string;
}

/** Signs an HS256 development token with the claims of README.md#principals. */
export function signDevelopmentToken(secret: string, request: TokenRequest): string {
  const sign = createSigner({ key: secret, algorithm: 'HS256', expiresIn: request.ttlSeconds * 1000 });
  return sign({
    sub: request.sub,
    tenant_id: request.tenantId,
    kind: request.kind,
    jti: randomUUID(),
    ...(request.kind === 'operator' ? { roles: [request.role ?? 'tenant-operator'] } : {}),
    ...(request.family ? { family: request.family } : {}),
    ...(request.scope ? { scope: request.scope } : {}),
    ...(request.issuer ? { iss: request.issuer } : {}),
    ...(request.audience ? { aud: request.audience } : {}),
  });
}

/** The platform-operator token `npm start` prints in development mode. */
export function developmentToken(
  secret: string,
  config: { jwt: { issuer: string | undefined; audience: string | undefined } },
): string {
  return signDevelopmentToken(secret, {
    kind: 'operator',
    sub: 'dev.operator',
    tenantId: 'dev',
    role: 'platform-operator',
    ttlSeconds: 12 * 3600,
    ...(config.jwt.issuer ? { issuer: config.jwt.issuer } : {}),
    ...(config.jwt.audience ? { audience: config.jwt.audience } : {}),
  });
}
