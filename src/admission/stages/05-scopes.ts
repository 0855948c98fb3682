import { toolOf, type Stage } from '../step.js';

/** 5. The caller's token holds every scope the tool requires. */
export const scopesStage: Stage = {
  name: 'scopes',
  check({ principal }, state) {
    const missing = toolOf(state)
      .required_scopes.filter((s) => s.required && !principal.scopes.has(s.scope))
      .map((s) => s.scope);
    if (missing.length === 0) return { ok: true };
    return {
      ok: false,
      code: 'tool_scope_missing',
      message: `the token lacks scope ${missing.join(', ')}`,
      details: { missing },
    };
  },
};
