import { toolOf, type Stage } from '../step.js';

/**
 * 7. The input validates against the tool's input schema; for `external_call` tools the target
 * URL also passes the egress guard (narrowed by the grant's `egress_domains`).
 */
export const inputStage: Stage = {
  name: 'input',
  async check({ step }, state, { catalog, egress }) {
    const tool = toolOf(state);
    const validate = catalog.validators(tool).input;
    if (!validate(step.input)) {
      const errors = (validate.errors ?? [])
        .slice(0, 10)
        .map((e) => ({ path: e.instancePath || '/', message: e.message ?? 'invalid' }));
      return {
        ok: false,
        code: 'tool_input_schema_invalid',
        message: `the input does not match ${tool.id}@${tool.version}'s schema`,
        details: { errors },
      };
    }
    if (tool.category !== 'external_call' || !tool.egress) return { ok: true };
    const guard = await egress.check(step.input, tool.egress, state.grant?.capability_modifiers ?? {});
    if (guard.ok) return { ok: true };
    return {
      ok: false,
      code: guard.code,
      message: `egress refused: ${guard.reason}`,
      details: { reason: guard.reason, ...guard.details },
    };
  },
};
