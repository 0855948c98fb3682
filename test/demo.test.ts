import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormatsModule from 'ajv-formats';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DEMO_TOOL_PATHS, startDemoBackend } from '../src/cli/demo-backend.js';
import type { CatalogFile } from './helpers/seed-catalog.js';
import { freePort } from './helpers/net.js';

const addFormats = addFormatsModule as unknown as (ajv: Ajv2020) => Ajv2020;
const root = new URL('..', import.meta.url).pathname;
const catalog = JSON.parse(readFileSync(join(root, 'examples/scf-catalog.json'), 'utf8')) as CatalogFile;
const agentTools = catalog.tools.filter((tool) => tool.category === 'read_only' || tool.category === 'draft_write');

/** A valid input for each agent tool of the example catalog. */
const SAMPLE_INPUTS: Record<string, unknown> = {
  get_scf_version: {},
  list_scf_frameworks: {},
  get_scf_framework_requirements: { framework_id: 'iso-27001-2022' },
  get_scf_control: { control_id: 'GOV-01' },
  get_scf_control_by_code: { code: 'IAC-01' },
  get_official_scf_mappings: { control_id: 'GOV-01', framework_id: 'nist-csf-2.0' },
  search_assessment_kb: { query: 'access reviews' },
  get_evidence_candidates: { control_id: 'GOV-01' },
  get_chunk_context: { chunk_id: 'chunk-1' },
  list_document_metadata: {},
  get_approved_soa: {},
  list_soa_items: {},
  suggest_soa_item_update_draft: { soa_item_id: 'soa-1', applicable: true, justification: 'in scope for the audit' },
  get_approved_gap_analysis: {},
  list_gap_findings: {},
  suggest_gap_finding_draft: { control_id: 'GOV-01', status: 'implemented', rationale: 'the policy is approved' },
  get_maturity_context: {},
  suggest_maturity_score_draft: { control_id: 'GOV-01', score: 3, rationale: 'defined and followed' },
  get_poam_context: {},
  suggest_poam_item_draft: { control_id: 'GOV-01', action: 'write the missing policy', due_date: '2027-03-01' },
  get_report_sources: {},
  suggest_report_section_draft: { section: 'summary', source_ids: ['src-1'] },
};

let backend: Awaited<ReturnType<typeof startDemoBackend>>;
beforeAll(async () => {
  backend = await startDemoBackend({ host: '127.0.0.1', port: 0, quiet: true });
});
afterAll(() => {
  backend?.server.close();
  backend?.server.closeAllConnections();
});

async function call(path: string, input: unknown): Promise<{ status: number; body: unknown }> {
  const response = await fetch(`${backend.url}/${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-toolgate-tenant-id': 'dev' },
    body: JSON.stringify(input),
  });
  return { status: response.status, body: await response.json() };
}

describe('npm run demo:backend', () => {
  it('judges the quickstart’s claims', async () => {
    expect(await call('fact-check', { claim: 'The Earth orbits the Sun' })).toMatchObject({
      status: 200,
      body: { verdict: 'supported' },
    });
    expect(await call('fact-check', { claim: 'The Moon is made of cheese.' })).toMatchObject({
      status: 200,
      body: { verdict: 'refuted' },
    });
    expect(await call('fact-check', { claim: 'Cats can fly' })).toMatchObject({
      status: 200,
      body: { verdict: 'unverified' },
    });
  });

  it('answers every agent tool of the example catalog with an output its output_schema accepts', async () => {
    const ajv = addFormats(new Ajv2020({ strict: false }));
    expect(agentTools.map((tool) => tool.id).sort()).toEqual(Object.keys(SAMPLE_INPUTS).sort());
    for (const tool of agentTools) {
      expect(DEMO_TOOL_PATHS, tool.id).toContain(tool.id);
      const input = SAMPLE_INPUTS[tool.id];
      expect(ajv.validate(tool.input_schema as object, input), `${tool.id} sample input: ${ajv.errorsText()}`).toBe(
        true,
      );
      const answer = await call(tool.id, input);
      expect(answer.status, tool.id).toBe(200);
      expect(ajv.validate(tool.output_schema as object, answer.body), `${tool.id} output: ${ajv.errorsText()}`).toBe(
        true,
      );
    }
  });

  it('answers 404 in JSON for what it does not serve', async () => {
    expect(await call('get_scf_control', { control_id: 'XYZ-99' })).toMatchObject({ status: 404 });
    expect(await call('approve_soa', {})).toMatchObject({ status: 404 });
  });
});

describe('npm run seed:example', () => {
  it('names the gateway URL it tried when nothing answers there', { timeout: 60_000 }, async () => {
    const port = await freePort();
    const result = spawnSync(join(root, 'node_modules', '.bin', 'tsx'), ['src/cli/seed-example.ts', '--token', 'x'], {
      cwd: root,
      env: { PATH: process.env.PATH, HOME: process.env.HOME, PORT: String(port) },
      encoding: 'utf8',
    });
    expect(result.status).toBe(3);
    expect(result.stderr).toContain(`cannot reach the gateway at http://127.0.0.1:${port}`);
    expect(result.stderr).toContain('ECONNREFUSED');
  });
});
