import type { Stage } from '../step.js';

/**
 * 1. The tool and version resolve in this replica's (fresh) copy of the registry, as the agent's
 * views resolve them: a newer version the agent may not use does not shadow an older one it may.
 */
export const registryStage: Stage = {
  name: 'registry',
  async check({ principal, step }, state, { catalog, tenantPolicy }) {
    // A replica that never loaded the registry, or lost it for long, fails closed rather than
    // answering "no such tool" from an empty or stale copy.
    const fresh = catalog.readiness();
    if (!fresh.ok)
      return {
        ok: false,
        code: 'gateway_unavailable',
        message: 'the tool registry cannot be confirmed current on this replica',
        details: { reason: fresh.reason ?? null },
      };
    const resolved = await catalog.resolve(step.tool_id, step.version, {
      as: 'caller',
      agent: { agentId: principal.id, family: principal.family },
      externalCallEnabled: () => tenantPolicy.externalCallEnabled(principal.tenantId),
    });
    if (!resolved.ok) {
      return resolved.code === 'tool_not_registered'
        ? { ok: false, code: resolved.code, message: `tool ${step.tool_id} is not registered` }
        : {
            ok: false,
            code: resolved.code,
            message: `no version of ${step.tool_id} matches ${step.version ?? 'the newest'}`,
            details: { version: step.version ?? null },
          };
    }
    state.tool = resolved.tool;
    return { ok: true };
  },
};
