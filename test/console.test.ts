import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { installErrorHandlers } from '../src/http/error-handler.js';
import { consoleRoutes } from '../src/http/routes/console.js';
import { contractViolations } from './helpers/contract.js';
import { startHarness, type Harness } from './helpers/harness.js';

// How the gateway serves the console's files; what the console does is test/console-e2e.test.ts.
let built: string;
let unbuilt: string;

async function appServing(assetsDir: string): Promise<FastifyInstance> {
  const app = Fastify();
  installErrorHandlers(app);
  await app.register(consoleRoutes, { assetsDir });
  return app;
}

/** GET `url` from `app`, failing on any answer openapi.yaml does not document. */
async function get(app: FastifyInstance, url: string) {
  const response = await app.inject({ method: 'GET', url });
  const violations = contractViolations(
    'GET',
    url,
    response.statusCode,
    response.headers['content-type'] as string | undefined,
    response.body,
  );
  expect(violations).toEqual([]);
  return response;
}

beforeAll(async () => {
  built = await mkdtemp(join(tmpdir(), 'toolgate-console-'));
  await mkdir(join(built, 'assets'));
  await writeFile(join(built, 'index.html'), '<!doctype html><title>console</title>');
  await writeFile(join(built, 'assets', 'index-abc123.js'), 'console.log(1)');
  await writeFile(join(built, 'assets', 'index-abc123.css'), 'body{}');
  unbuilt = await mkdtemp(join(tmpdir(), 'toolgate-console-unbuilt-'));
});

afterAll(async () => {
  await rm(built, { recursive: true, force: true });
  await rm(unbuilt, { recursive: true, force: true });
});

describe('GET /console', () => {
  it('serves the built page, with a policy that lets it load and call nothing but this gateway', async () => {
    const app = await appServing(built);
    const response = await get(app, '/console');
    await app.close();
    expect(response.statusCode).toBe(200);
    expect(response.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(response.body).toContain('<title>console</title>');
    const policy = String(response.headers['content-security-policy']);
    expect(policy).toContain("default-src 'none'");
    expect(policy).toContain("script-src 'self'");
    expect(policy).toContain("connect-src 'self'");
    expect(policy).toContain("frame-ancestors 'none'");
    expect(response.headers['x-frame-options']).toBe('DENY');
    expect(response.headers['x-content-type-options']).toBe('nosniff');
    expect(response.headers['referrer-policy']).toBe('no-referrer');
  });

  it('serves a rebuilt page without a restart (a rebuild names new hashed assets)', async () => {
    const folder = await mkdtemp(join(tmpdir(), 'toolgate-console-rebuilt-'));
    const app = await appServing(folder);
    try {
      expect((await get(app, '/console')).statusCode).toBe(404);
      await writeFile(join(folder, 'index.html'), '<script src="/console/assets/index-first.js"></script>');
      const first = await get(app, '/console');
      expect(first.statusCode).toBe(200);
      expect(first.body).toContain('index-first.js');
      await writeFile(join(folder, 'index.html'), '<script src="/console/assets/index-second.js"></script>');
      const second = await get(app, '/console');
      expect(second.statusCode).toBe(200);
      expect(second.body).toContain('index-second.js');
      expect(second.body).not.toContain('index-first.js');
    } finally {
      await app.close();
      await rm(folder, { recursive: true, force: true });
    }
  });

  it('answers 404 not_found, saying how to build it, when the console is not built', async () => {
    const app = await appServing(unbuilt);
    const response = await get(app, '/console');
    await app.close();
    expect(response.statusCode).toBe(404);
    expect(response.json().error.code).toBe('not_found');
    expect(response.json().error.message).toContain('npm run build');
  });

  it('is public in the gateway: no token needed for the page (the console signs in through the API)', async () => {
    const h: Harness = await startHarness();
    try {
      const response = await h.client.get('/console');
      expect([200, 404]).toContain(response.status);
      expect(response.status).not.toBe(401);
      const api = await h.client.get('/grants');
      expect(api.status).toBe(401);
    } finally {
      await h.close();
    }
  });
});

describe('GET /console/assets/{file}', () => {
  it('serves scripts and styles as immutable, with their types', async () => {
    const app = await appServing(built);
    const script = await get(app, '/console/assets/index-abc123.js');
    const style = await get(app, '/console/assets/index-abc123.css');
    await app.close();
    expect(script.statusCode).toBe(200);
    expect(script.headers['content-type']).toMatch(/^application\/javascript/);
    expect(script.headers['cache-control']).toContain('immutable');
    expect(style.statusCode).toBe(200);
    expect(style.headers['content-type']).toMatch(/^text\/css/);
  });

  it('answers 404 for a file that is not there, and never reaches outside the assets folder', async () => {
    const app = await appServing(built);
    const missing = await get(app, '/console/assets/nothing.js');
    const outside = await app.inject({ method: 'GET', url: '/console/assets/..%2Findex.html' });
    await app.close();
    expect(missing.statusCode).toBe(404);
    expect(missing.json().error.code).toBe('not_found');
    expect(outside.statusCode).toBeGreaterThanOrEqual(400);
    expect(outside.body).not.toContain('<title>console</title>');
  });
});
