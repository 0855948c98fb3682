import { toolOf, type Stage } from '../step.js';

/** 7. The input validates against the tool's input schema. */
export const inputStage: Stage = {
  name: 'input',
  check({ step }, state, { catalog }) {
    const tool = toolOf(state);
    const validate = catalog.validators(tool).input;
    if (validate(step.input)) return { ok: true };
    const errors = (validate.errors ?? []).slice(0, 10).map((e) => ({ path: e.instancePath || '/', message: e.message ?? 'invalid' }));
    return { ok: false, code: 'tool_input_schema_invalid', message: `the input does not match ${tool.id}@${tool.version}'s schema`, details: { errors } };
  },
};
