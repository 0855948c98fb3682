import { toolOf, type Stage } from '../step.js';

/** 2. Agents use only read_only and draft_write tools, and external_call where the tenant enabled it. */
export const categoryStage: Stage = {
  name: 'category',
  async check({ principal }, state, { tenantPolicy }) {
    const tool = toolOf(state);
    if (tool.category === 'read_only' || tool.category === 'draft_write') return { ok: true };
    if (
      tool.category === 'external_call' &&
      tool.egress &&
      (await tenantPolicy.externalCallEnabled(principal.tenantId))
    ) {
      return { ok: true };
    }
    return {
      ok: false,
      code: 'tool_category_blocked',
      message:
        tool.category === 'external_call'
          ? 'external calls are not enabled for this tenant'
          : `agents may not use ${tool.category} tools`,
      details: { category: tool.category },
    };
  },
};
