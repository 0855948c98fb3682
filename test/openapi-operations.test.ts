import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { docsRoutes } from '../src/http/routes/docs.js';
import { openapi } from './helpers/contract.js';

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'head', 'options', 'trace'];

interface Operation {
  operationId?: string;
  description?: string;
}

const operations = Object.entries(openapi.paths).flatMap(([path, item]) =>
  Object.entries(item as Record<string, Operation>)
    .filter(([method]) => METHODS.includes(method))
    .map(([method, operation]) => ({ name: `${method.toUpperCase()} ${path}`, ...operation })),
);

describe('openapi.yaml operations', () => {
  it('each have a camelCase operationId, the name a generated client gives the call', () => {
    const unnamed = operations
      .filter((op) => !/^[a-z][a-zA-Z0-9]*$/.test(op.operationId ?? ''))
      .map((op) => `${op.name}: ${op.operationId}`);
    expect(unnamed).toEqual([]);
  });

  it('never share an operationId', () => {
    const seen = new Map<string, string>();
    const shared = operations.flatMap((op) => {
      const first = seen.get(op.operationId!);
      seen.set(op.operationId!, op.name);
      return first ? [`${op.operationId}: ${first} and ${op.name}`] : [];
    });
    expect(shared).toEqual([]);
  });

  it('each have a description', () => {
    expect(operations.filter((op) => !op.description?.trim()).map((op) => op.name)).toEqual([]);
  });
});

describe('/docs', () => {
  it('points Swagger UI at the gateway that served it, not at a fixed host and port', async () => {
    const app = Fastify();
    await app.register(docsRoutes);
    const served = (await app.inject({ method: 'GET', url: '/docs/json' })).json();
    await app.close();
    expect(served.servers).toEqual([{ url: '/', description: 'this gateway' }]);
    expect(Object.keys(served.paths)).toEqual(Object.keys(openapi.paths));
  });

  it('may not be framed by another site, whatever page of it is asked for (it shares an origin with /console)', async () => {
    const app = Fastify();
    await app.register(docsRoutes);
    for (const url of ['/docs', '/docs/', '/docs/static/swagger-ui-bundle.js', '/docs/json', '/openapi.json']) {
      const response = await app.inject({ method: 'GET', url });
      expect(response.statusCode, url).toBeLessThan(400);
      const policy = String(response.headers['content-security-policy']);
      expect(policy, url).toContain("frame-ancestors 'none'");
      expect(policy, url).toContain("script-src 'self'");
      expect(response.headers['x-frame-options'], url).toBe('DENY');
    }
    await app.close();
  });
});
