import { toolOf, type Stage } from '../step.js';

/** 6. Every required context key is present, and a context tenant is the token's own. */
export const contextStage: Stage = {
  name: 'context',
  check({ principal, run }, state) {
    const tenant = run.context.tenant_id;
    if (tenant !== undefined && tenant !== principal.tenantId) {
      return {
        ok: false,
        code: 'invalid_request',
        message: 'context.tenant_id is not the tenant of the token',
        details: { field: 'context.tenant_id' },
      };
    }
    const missing = toolOf(state).required_context.filter((key) => {
      const value = run.context[key];
      return value === undefined || value === null || value === '';
    });
    if (missing.length === 0) return { ok: true };
    return {
      ok: false,
      code: 'missing_required_context',
      message: `context lacks ${missing.join(', ')}`,
      details: { missing },
    };
  },
};
