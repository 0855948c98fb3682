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
