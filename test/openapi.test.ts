import { Validator } from '@seriousme/openapi-schema-validator';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openapi } from './helpers/contract.js';
import { startHarness, type Harness } from './helpers/harness.js';

let h: Harness;
beforeAll(async () => {
  h = await startHarness();
});
afterAll(() => h.close());

describe('openapi.yaml', () => {
  it('is a valid OpenAPI 3.1 document', async () => {
    const validator = new Validator();
    const result = await validator.validate(openapi as never);
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe('3.1');
  });

  it('documents every route the gateway serves, and nothing more', () => {
    const served = new Set(
      h.client.app.registeredRoutes
        .filter((route) => !/ \/docs/.test(route) && !route.startsWith('HEAD '))
        .map((route) => route.replace(/:([A-Za-z_]+)/g, '{$1}')),
    );
    const documented = new Set(
      Object.entries(openapi.paths).flatMap(([path, item]) =>
        Object.keys(item as object)
          .filter((key) => ['get', 'post', 'put', 'patch', 'delete', 'options'].includes(key))
          .map((method) => `${method.toUpperCase()} ${path}`),
      ),
    );
    expect([...served].sort()).toEqual([...documented].sort());
  });

  it('documents 413 on every operation whose method carries a body, as the body limit applies to each', () => {
    const undocumented = Object.entries(openapi.paths).flatMap(([path, item]) =>
      Object.entries(item as Record<string, { requestBody?: unknown; responses?: Record<string, unknown> }>)
        .filter(
          ([method, operation]) =>
            ['post', 'put', 'patch', 'delete'].includes(method) || operation.requestBody !== undefined,
        )
        .filter(([, operation]) => !('413' in (operation.responses ?? {})))
        .map(([method]) => `${method.toUpperCase()} ${path}`),
    );
    expect(undocumented).toEqual([]);
  });

  it('is served as /openapi.json, with interactive docs at /docs', async () => {
    const json = await h.client.get('/openapi.json');
    expect(json.status).toBe(200);
    expect(json.body.openapi).toBe('3.1.0');
    const docs = await h.client.app.inject({ method: 'GET', url: '/docs/' });
    expect(docs.statusCode).toBe(200);
    expect(docs.body).toContain('swagger');
  });
});
