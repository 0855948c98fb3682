import { execFile } from 'node:child_process';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createToolgateClient, GatewayUnreachableError, ToolgateError, unwrap } from '../src/client/index.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { freePort } from './helpers/net.js';
import { tokens } from './helpers/tokens.js';

const root = new URL('..', import.meta.url).pathname;
const run = promisify(execFile);

describe('the generated client', () => {
  it('is generated from openapi.yaml as it is now (npm run generate:client)', async () => {
    const check = await run('npm', ['run', '--silent', 'generate:client', '--', '--check'], { cwd: root }).then(
      () => ({ fresh: true, output: '' }),
      (error: { stdout: string; stderr: string }) => ({ fresh: false, output: `${error.stdout}${error.stderr}` }),
    );
    expect(check.fresh, `src/client/openapi-types.ts is stale: run npm run generate:client\n${check.output}`).toBe(
      true,
    );
  }, 60_000);

  it('type-checks a program that imports toolgate/client, and refuses one that misuses it', async () => {
    // Inside the package, so that `toolgate/client` resolves through package.json `exports`.
    await mkdir(join(root, 'tmp'), { recursive: true });
    const dir = await mkdtemp(join(root, 'tmp', 'client-program-'));
    try {
      await writeFile(
        join(dir, 'program.ts'),
        `import { createToolgateClient, unwrap, ToolgateError, type Schemas } from 'toolgate/client';

const api = createToolgateClient({ baseUrl: 'http://127.0.0.1:8080', token: process.env.TOOLGATE_TOKEN });
const grant: Schemas['Grant'] = await unwrap(
  api.POST('/grants', {
    body: { agent_id: 'a1', tool_id: 'web.fetch', scope: 'per-tenant', expires_at: new Date().toISOString(), rationale: 'pilot' },
  }),
);
const status: 'live' | 'expired' | 'revoked' = grant.status;
const page = await unwrap(api.GET('/kill-switches', { params: { query: { state: 'armed', limit: 10 } } }));
const ids: string[] = page.items.map((k) => k.id);
// A budget's defaulted fields may be left out.
await unwrap(api.POST('/budgets', { body: { scope: 'tenant', period: 'day', limit_units: 10 } }));
try {
  await unwrap(api.GET('/grants/{id}', { params: { path: { id: 'grt_x' } } }));
} catch (error) {
  if (error instanceof ToolgateError) console.log(error.code, error.status, status, ids);
}
// @ts-expect-error: a grant needs its rationale
await unwrap(api.POST('/grants', { body: { agent_id: 'a1', tool_id: 't', scope: 'per-tenant', expires_at: '' } }));
// @ts-expect-error: no such scope
await unwrap(api.POST('/grants', { body: { agent_id: 'a1', tool_id: 't', scope: 'forever', expires_at: '', rationale: 'r' } }));
// @ts-expect-error: no such route
await api.GET('/grant');
// @ts-expect-error: a grant has no such field
console.log(grant.granted_to);
`,
      );
      await writeFile(
        join(dir, 'tsconfig.json'),
        JSON.stringify({
          compilerOptions: {
            target: 'ES2022',
            module: 'NodeNext',
            moduleResolution: 'NodeNext',
            lib: ['ES2023', 'DOM'],
            types: ['node'],
            strict: true,
            noEmit: true,
            skipLibCheck: true,
            // Resolve toolgate/client to its TypeScript source, as from a checkout (no build needed).
            customConditions: ['toolgate-source'],
          },
          files: ['program.ts'],
        }),
      );
      const compiled = await run(join(root, 'node_modules', '.bin', 'tsc'), ['-p', join(dir, 'tsconfig.json')], {
        cwd: root,
      }).then(
        () => ({ ok: true, output: '' }),
        (error: { stdout: string }) => ({ ok: false, output: error.stdout }),
      );
      expect(compiled.output).toBe('');
      expect(compiled.ok).toBe(true);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 120_000);
});

describe('createToolgateClient against a gateway', () => {
  let h: Harness;
  let url: string;
  beforeAll(async () => {
    h = await startHarness();
    url = await h.client.app.listen({ port: 0, host: '127.0.0.1' });
  });
  afterAll(() => h.close());

  it('calls with the token it was given and answers typed data', async () => {
    const api = createToolgateClient({ baseUrl: `${url}/`, token: tokens.tenantOperator('t1', 'ops.one') });
    const principal = await unwrap(api.GET('/whoami'));
    expect(principal).toMatchObject({ kind: 'operator', id: 'ops.one', tenant_id: 't1', role: 'tenant-operator' });
  });

  it("throws a refusal as a ToolgateError with the API's code, message, details and status", async () => {
    const api = createToolgateClient({ baseUrl: url, token: tokens.tenantOperator('t1') });
    const refusal = await unwrap(api.GET('/grants/{id}', { params: { path: { id: 'grt_missing' } } })).catch(
      (error: unknown) => error,
    );
    expect(refusal).toBeInstanceOf(ToolgateError);
    expect(refusal).toMatchObject({ status: 404, code: 'not_found', message: 'grant grt_missing not found' });
    const anonymous = await unwrap(createToolgateClient({ baseUrl: url }).GET('/whoami')).catch(
      (error: unknown) => error,
    );
    expect(anonymous).toMatchObject({ status: 401, code: 'unauthenticated' });
  });

  it('names the URL it tried when nothing answers there', async () => {
    const nowhere = `http://127.0.0.1:${await freePort()}`;
    const failure = await unwrap(createToolgateClient({ baseUrl: nowhere }).GET('/health')).catch(
      (error: unknown) => error,
    );
    expect(failure).toBeInstanceOf(GatewayUnreachableError);
    expect((failure as Error).message).toBe(`cannot reach the gateway at ${nowhere}/health: ECONNREFUSED`);
  });
});
