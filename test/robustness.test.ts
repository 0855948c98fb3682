import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openapi } from './helpers/contract.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { tokens } from './helpers/tokens.js';

/**
 * No input ever yields a 500 (SPEC §7): every documented operation, called by every kind of
 * principal with malformed path parameters, query strings and bodies, answers a documented
 * client error (the harness checks each answer against openapi.yaml).
 */
let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

const operations = Object.entries(openapi.paths).flatMap(([path, item]) =>
  Object.keys(item as object)
    .filter((key) => ['get', 'post', 'put', 'delete', 'patch'].includes(key))
    .map((method) => ({ method: method.toUpperCase(), path })),
);

const weirdIds = ['x', '%00', 'a'.repeat(300), '..%2f..%2fetc', '%F0%9F%92%A9', '1e309'];
const weirdBodies: unknown[] = [
  {},
  [],
  'text',
  42,
  null,
  { run_id: 7, plan: 'no' },
  { a: { b: { c: [1, { d: null }] } } },
  { tenant_id: { $ne: 1 } },
];
const weirdQueries: Array<Record<string, string>> = [
  {},
  { limit: '-1' },
  { limit: 'NaN', cursor: '%%%' },
  { tenant_id: '', status: 'bogus' },
  { since: '2026-13-45' },
];

const principals = {
  platform: tokens.platform(),
  tenant: tokens.tenantOperator('fuzz-tenant'),
  agent: tokens.agent('fuzz.agent', { tenant: 'fuzz-tenant' }),
};

describe('malformed input', () => {
  it.each(operations)('$method $path never answers 500', async ({ method, path }) => {
    for (const [who, token] of Object.entries(principals)) {
      for (const id of weirdIds) {
        const url = path.replace(/\{[^}]+\}/g, id);
        const bodies = method === 'GET' || method === 'DELETE' ? [undefined] : weirdBodies;
        for (const body of bodies) {
          for (const query of weirdQueries.slice(0, method === 'GET' ? weirdQueries.length : 1)) {
            const res = await h.client.request(method, url, { token, query, ...(body !== undefined ? { body } : {}) });
            expect(
              res.status,
              `${who} ${method} ${url} ${JSON.stringify(query)} ${JSON.stringify(body)} → ${res.text.slice(0, 200)}`,
            ).toBeLessThan(500);
          }
        }
      }
    }
  });
});
