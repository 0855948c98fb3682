import { createSigner } from 'fast-jwt';

export const TEST_JWT_SECRET = 'test-secret-test-secret-test-secret-0123456789';

export interface AgentTokenOptions {
  tenant: string;
  family?: string;
  scope?: string;
}

/** Signs arbitrary claims (expiry one hour ahead unless given) with the test secret. */
export function signToken(claims: Record<string, unknown>, secret: string = TEST_JWT_SECRET): string {
  const sign = createSigner({ key: secret, algorithm: 'HS256' });
  return sign({ exp: Math.floor(Date.now() / 1000) + 3600, ...claims });
}

export const tokens = {
  platform: (sub = 'ops.platform', tenant = 'platform') =>
    signToken({ sub, tenant_id: tenant, kind: 'operator', roles: ['platform-operator'] }),
  tenantOperator: (tenant: string, sub = `ops.${tenant}`) =>
    signToken({ sub, tenant_id: tenant, kind: 'operator', roles: ['tenant-operator'] }),
  agent: (sub: string, options: AgentTokenOptions) =>
    signToken({
      sub,
      tenant_id: options.tenant,
      kind: 'agent',
      ...(options.family ? { family: options.family } : {}),
      ...(options.scope ? { scope: options.scope } : {}),
    }),
};
