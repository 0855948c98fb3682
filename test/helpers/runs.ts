import type { AppClient, TestResponse } from './harness.js';

/** A plan step calling `tool_id` with `{ q }`, at `version` (a range) when given. */
export function step(
  tool_id: string,
  q = 'hello',
  version?: string,
): { tool_id: string; input: { q: string }; version?: string } {
  return { tool_id, input: { q }, ...(version ? { version } : {}) };
}

/** `POST /runs/execute` as the agent `token` names; the context is empty unless `body` gives one. */
export function execute(client: AppClient, token: string, body: Record<string, unknown>): Promise<TestResponse> {
  return client.post('/runs/execute', { token, body: { context: {}, ...body } });
}

/**
 * The columns of an ended run put back as a run cut off mid-call by `executor` looks: running, busy, no envelope yet,
 * and still its request (an ended run's request is dropped; recovery rebuilds from it).
 */
export function asCutOff(request: unknown, executor = 'rep_gone') {
  return {
    status: 'running',
    busy: true,
    executor_id: executor,
    envelope: null,
    http_status: null,
    request: JSON.stringify(request),
  } as const;
}
