import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';
import { grantTool, newRunId, toolBody } from './helpers/world.js';

/**
 * A GET backend gets the call's input as query parameters. The query its registered URL fixes is
 * the operator's: the agent's input never replaces one of its parameters, nor repeats it.
 */

const T = 'tenant-get-query';
const AGENT = 'veritas.fact-checker';
const agent = tokens.agent(AGENT, { tenant: T, family: 'veritas' });

let h: Harness;
let backend: TestBackend;

const openInput = { type: 'object', properties: { q: { type: 'string' } } };

async function register(id: string, url: string, method = 'GET'): Promise<void> {
  const body = {
    ...toolBody({ id, backendUrl: url, allowed_agents: [AGENT], input_schema: openInput }),
    backend: { url, method, timeout_ms: 2000, max_response_bytes: 65536, headers: {} },
  };
  const res = await h.client.post('/tools', { token: tokens.platform(), body });
  expect(res.status, JSON.stringify(res.body)).toBe(201);
  await grantTool(h.client, { tenant: T, agent: AGENT, tool: id });
}

/** Runs one call of `tool` and answers the request its backend received. */
async function callOnce(tool: string, input: Record<string, unknown>) {
  const before = backend.hitsOn('/echo').length;
  const res = await h.client.post('/runs/execute', {
    token: agent,
    body: { run_id: newRunId(), context: {}, plan: [{ tool_id: tool, input }] },
  });
  expect(res.status, JSON.stringify(res.body)).toBe(200);
  expect(res.body.steps[0]).toMatchObject({ status: 'completed' });
  const hits = backend.hitsOn('/echo');
  expect(hits).toHaveLength(before + 1);
  return hits[hits.length - 1]!;
}

beforeAll(async () => {
  h = await startHarness();
  backend = await new TestBackend().start();
  await register('fixed.get', `${backend.url}/echo?api_key=SECRET&mode=safe`);
  await register('signed.get', `${backend.url}/echo?sig=a%20b~&flag&tag=x&tag=y`);
  await register('plain.get', `${backend.url}/echo`);
  await register('fixed.post', `${backend.url}/echo?mode=safe`, 'POST');
});

afterAll(async () => {
  await backend?.close();
  await h?.close();
});

describe('GET backends: the registered URL’s query parameters are the operator’s', () => {
  it('sends the fixed parameters unchanged when the input names the same keys, and drops those input keys', async () => {
    const hit = await callOnce('fixed.get', { q: 'hello', mode: 'unsafe', api_key: 'agent-key' });
    expect(hit.method).toBe('GET');
    expect(hit.query).toBe('api_key=SECRET&mode=safe&q=hello');
    const params = new URLSearchParams(hit.query);
    expect(params.getAll('mode')).toEqual(['safe']);
    expect(params.getAll('api_key')).toEqual(['SECRET']);
  });

  it('drops the spellings lenient backends read as a fixed name (case, `.`/space for `_`, `[]` suffix)', async () => {
    const hit = await callOnce('fixed.get', {
      MODE: 'unsafe',
      'mode[]': 'unsafe',
      'api.key': 'k1',
      'api key': 'k2',
      ' API_KEY[x]': 'k3',
      q: 'v',
    });
    expect(hit.query).toBe('api_key=SECRET&mode=safe&q=v');
  });

  it('keeps the registered query byte for byte (encoding, bare and repeated parameters) and adds the input after it', async () => {
    const hit = await callOnce('signed.get', { q: 'a b', n: 2, filter: { a: [1, 'x'] }, none: null, tag: 'z' });
    // Non-string values travel as their JSON text; `tag` is fixed, so the input's is not sent.
    expect(hit.query).toBe(
      `sig=a%20b~&flag&tag=x&tag=y&q=a+b&n=2&filter=${encodeURIComponent('{"a":[1,"x"]}')}&none=null`,
    );
    expect(new URLSearchParams(hit.query).get('filter')).toBe('{"a":[1,"x"]}');
  });

  it('sends every input key when the registered URL has no query', async () => {
    const hit = await callOnce('plain.get', { q: 'hello', mode: 'unsafe' });
    expect(hit.query).toBe('q=hello&mode=unsafe');
  });

  it('leaves the query alone for methods with a body: the input is the JSON body', async () => {
    const hit = await callOnce('fixed.post', { q: 'hello', mode: 'unsafe' });
    expect(hit).toMatchObject({ method: 'POST', query: 'mode=safe', body: { q: 'hello', mode: 'unsafe' } });
  });
});
