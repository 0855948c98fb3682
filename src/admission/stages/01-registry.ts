import type { Stage } from '../step.js';

/** 1. The tool and version resolve in the registry. */
export const registryStage: Stage = {
  name: 'registry',
  check({ step }, state, { catalog }) {
    const resolved = catalog.resolve(step.tool_id, step.version);
    if (!resolved.ok) {
      return resolved.code === 'tool_not_registered'
        ? { ok: false, code: resolved.code, message: `tool ${step.tool_id} is not registered` }
        : { ok: false, code: resolved.code, message: `no version of ${step.tool_id} matches ${step.version ?? 'the newest'}`, details: { version: step.version ?? null } };
    }
    state.tool = resolved.tool;
    return { ok: true };
  },
};
