import { pino } from 'pino';
import { buildApp } from '../../src/app.js';
import { loadVerificationKeys } from '../../src/auth/jwt-keys.js';
import type { Database } from '../../src/db/database.js';
import type { ToolFacts, ToolFactsLookup } from '../../src/grants/tool-facts.js';
import { AppClient, testConfig } from './harness.js';

/**
 * The registered tools the control-plane tests grant, as the registry would describe them.
 * Stands in for `services.catalog` until the registry is merged.
 */
export const CONTROL_PLANE_TOOLS: Record<string, ToolFacts> = {
  'scf.read': { id: 'scf.read', category: 'read_only', egress: null, target: { family: 'scf', provider: 'internal', region: 'eu-west' } },
  'draft.write': { id: 'draft.write', category: 'draft_write', egress: null, target: null },
  'web.fetch': {
    id: 'web.fetch',
    category: 'external_call',
    egress: { allowed_hosts: ['*.un.org', 'api.example.com'] },
    target: { family: 'retrieval', provider: 'acme', region: 'us-east' },
  },
  'final.publish': { id: 'final.publish', category: 'final_write', egress: null, target: null },
  'admin.reset': { id: 'admin.reset', category: 'admin', egress: null, target: null },
};

export const controlPlaneTools: ToolFactsLookup = {
  resolve: (toolId) => {
    const tool = CONTROL_PLANE_TOOLS[toolId];
    return tool ? { ok: true, tool } : { ok: false, code: 'tool_not_registered' };
  },
};

/** An app on `database` that knows the tools above. */
export async function startControlPlaneApp(database: Database, env: Record<string, string> = {}): Promise<AppClient> {
  const config = testConfig(env);
  const app = await buildApp({
    config,
    database,
    keys: await loadVerificationKeys(config),
    logger: pino({ level: 'silent' }),
    tools: controlPlaneTools,
  });
  await app.ready();
  return new AppClient(app);
}
