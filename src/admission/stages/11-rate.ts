import { toolOf, type Stage } from '../step.js';

/** 11. A token is taken from the (tenant, agent, tool) bucket; an empty bucket is back-pressure. */
export const rateStage: Stage = {
  name: 'rate',
  async check({ principal, dryRun, unclaimed }, state, { rateLimiter }) {
    const tool = toolOf(state);
    if (!tool.rate_limit) return { ok: true };
    const query = {
      tenantId: principal.tenantId,
      agentId: principal.id,
      toolId: tool.id,
      capacity: tool.rate_limit.capacity,
      refillPerSecond: tool.rate_limit.refill_per_second,
    };
    // A run not claimed yet is refused from the level this replica knows, which its refusal's record confirms.
    const known = unclaimed && !dryRun ? rateLimiter.refusalFromKnown?.(query) : undefined;
    if (known) state.rateRefusedAt = known.level;
    const result = known?.decision ?? (dryRun ? await rateLimiter.peek(query) : await rateLimiter.take(query));
    if (result.ok) {
      if (!dryRun) state.rateTaken = query;
      return { ok: true };
    }
    return {
      ok: false,
      code: 'rate_limited',
      message: `rate limit reached; retry in ${result.retryAfterSeconds} s`,
      details: { retry_after_seconds: result.retryAfterSeconds },
      retryAfterSeconds: result.retryAfterSeconds,
    };
  },
};
