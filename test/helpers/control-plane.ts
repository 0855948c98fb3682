import type { AppOptions } from '../../src/app.js';
import type { Database } from '../../src/db/database.js';
import type { ToolFacts } from '../../src/grants/tool-facts.js';
import { AppClient } from './harness.js';
import { tokens } from './tokens.js';
import { toolBody } from './world.js';

/** The registered tools the control-plane tests grant. */
export const CONTROL_PLANE_TOOLS: Record<string, ToolFacts> = {
  'scf.read': {
    id: 'scf.read',
    category: 'read_only',
    egress: null,
    target: { family: 'scf', provider: 'internal', region: 'eu-west' },
  },
  'draft.write': {
    id: 'draft.write',
    category: 'draft_write',
    egress: null,
    target: { family: null, provider: null, region: null },
  },
  'web.fetch': {
    id: 'web.fetch',
    category: 'external_call',
    egress: { allowed_hosts: ['*.un.org', 'api.example.com'] },
    target: { family: 'retrieval', provider: 'acme', region: 'us-east' },
  },
  'final.publish': {
    id: 'final.publish',
    category: 'final_write',
    egress: null,
    target: { family: null, provider: null, region: null },
  },
  'admin.reset': {
    id: 'admin.reset',
    category: 'admin',
    egress: null,
    target: { family: null, provider: null, region: null },
  },
};

/** An app on `database` whose registry holds the tools above (registering them is idempotent). */
export async function startControlPlaneApp(
  database: Database,
  env: Record<string, string> = {},
  options: Pick<AppOptions, 'now'> = {},
): Promise<AppClient> {
  const client = await AppClient.start(database, env, options);
  for (const tool of Object.values(CONTROL_PLANE_TOOLS)) {
    const highRisk = tool.category === 'final_write' || tool.category === 'admin';
    const body = toolBody({
      id: tool.id,
      category: tool.category,
      risk_level: highRisk ? 'high' : 'low',
      backendUrl: tool.category === 'external_call' ? null : 'http://127.0.0.1:9/unused',
      ...(tool.egress ? { egress: tool.egress } : {}),
      target: tool.target as { family?: string; provider?: string; region?: string },
    });
    const res = await client.post('/tools', { token: tokens.platform(), body });
    if (res.status !== 201 && res.status !== 200)
      throw new Error(`registering ${tool.id}: ${res.status} ${JSON.stringify(res.body)}`);
  }
  return client;
}
