import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { createEmptyDatabaseUrl, hasPostgresServer } from './helpers/database.js';
import { freePort } from './helpers/net.js';
import { TEST_JWT_SECRET, tokens } from './helpers/tokens.js';

const root = new URL('..', import.meta.url).pathname;

/** The environment of a fresh shell: no TOOLGATE_* but what a test passes. */
function bareEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  return { PATH: process.env.PATH, HOME: process.env.HOME, ...extra };
}

interface Outcome {
  status: number | null;
  stdout: string;
  stderr: string;
}

let gateway: ChildProcess;
let url: string;
let databaseUrl: string | undefined;
let dropDatabase: () => Promise<unknown> = async () => undefined;
const backend = new TestBackend();
const operator = tokens.platform('ops.cli', 't1');
const agent = tokens.agent('cli.agent', { tenant: 't1' });

/**
 * `toolgate …` as an operator types it: the package's bin, with TOOLGATE_URL and TOOLGATE_TOKEN set
 * and `stdin` piped in; killed after a minute, so that a command that never ends fails its test.
 */
function toolgate(args: string[], env: Record<string, string> = {}, stdin = ''): Promise<Outcome> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [join(root, 'bin', 'toolgate.js'), ...args], {
      cwd: root,
      env: bareEnv({ TOOLGATE_URL: url, TOOLGATE_TOKEN: operator, ...env }),
      timeout: 60_000,
    });
    child.stdin.end(stdin);
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
    child.on('close', (status) => resolve({ status, stdout, stderr }));
  });
}

const json = (outcome: Outcome) => JSON.parse(outcome.stdout) as any;
const callAsAgent = (input: unknown) =>
  toolgate(['runs', 'execute', '--tool', 'cli.echo', '--input', JSON.stringify(input)], { TOOLGATE_TOKEN: agent });

beforeAll(async () => {
  await backend.start();
  const port = await freePort();
  const dataDir = mkdtempSync(join(tmpdir(), 'toolgate-cli-'));
  if (hasPostgresServer) {
    const db = await createEmptyDatabaseUrl();
    databaseUrl = db.url;
    dropDatabase = db.drop;
  }
  gateway = spawn(process.execPath, ['--import', 'tsx', 'src/server.ts'], {
    cwd: root,
    env: bareEnv({
      PORT: String(port),
      TOOLGATE_JWT_SECRET: TEST_JWT_SECRET,
      TOOLGATE_DATA_DIR: dataDir,
      LOG_LEVEL: 'warn',
      ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
    }),
  });
  url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 1500; i += 1) {
    if (
      await fetch(`${url}/ready`).then(
        (r) => r.ok,
        () => false,
      )
    )
      return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('the gateway did not become ready');
}, 180_000);

afterAll(async () => {
  gateway?.kill('SIGTERM');
  await new Promise((resolve) => (gateway?.exitCode !== null ? resolve(undefined) : gateway.once('exit', resolve)));
  await backend.close();
  await dropDatabase();
});

describe('toolgate, run as an operator runs it', () => {
  let grantId: string;

  it('registers every contract of a folder, and again changes nothing', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'toolgate-contracts-'));
    writeFileSync(
      join(dir, 'echo.yaml'),
      [
        'id: cli.echo',
        'version: 1.0.0',
        'display_name: Echo',
        'description: Answers its input.',
        'category: read_only',
        'risk_level: low',
        'input_schema: { type: object }',
        'output_schema: { type: object }',
        'allowed_agents: [cli.agent]',
        'cost_units: 1',
        'dependencies: [{ tool_id: cli.lookup, range: "^1" }]',
        `backend: { url: "${backend.url}/echo", method: POST, timeout_ms: 5000, max_response_bytes: 65536, headers: {} }`,
      ].join('\n'),
    );
    // Named after the tool that depends on it: registered on the second pass.
    writeFileSync(
      join(dir, 'lookup.json'),
      JSON.stringify({
        id: 'cli.lookup',
        version: '1.0.0',
        display_name: 'Lookup',
        description: 'Looks up.',
        category: 'read_only',
        risk_level: 'low',
        input_schema: { type: 'object' },
        output_schema: { type: 'object' },
        cost_units: 1,
      }),
    );
    // The lookup has no backend: --backend-base gives it one; the echo keeps its own.
    const first = await toolgate(['tools', 'register', dir, '--backend-base', `${backend.url}/demo`]);
    expect(first.stderr).toBe('');
    expect(first.status).toBe(0);
    expect(first.stdout).toMatch(/^RESULT\s+ID\s+VERSION\s+FILE/);
    expect(first.stdout).toMatch(/registered\s+cli\.echo\s+1\.0\.0/);
    expect(first.stdout).toMatch(/registered\s+cli\.lookup\s+1\.0\.0/);

    const stored = (id: string) =>
      fetch(`${url}/tools/${id}`, { headers: { authorization: `Bearer ${operator}` } }).then(
        (r) => r.json() as Promise<{ backend: { url: string } }>,
      );
    expect((await stored('cli.lookup')).backend.url).toBe(`${backend.url}/demo/cli.lookup`);
    expect((await stored('cli.echo')).backend.url).toBe(`${backend.url}/echo`);

    const again = await toolgate(['tools', 'register', dir, '--backend-base', `${backend.url}/demo`, '--json']);
    expect(again.status).toBe(0);
    expect(json(again).items.map((r: { id: string; result: string }) => `${r.id} ${r.result}`)).toEqual([
      'cli.echo unchanged',
      'cli.lookup unchanged',
    ]);
  }, 120_000);

  it('grants a tool for a duration, after which the agent calls it', async () => {
    const before = Date.now();
    const created = await toolgate([
      'grants',
      'create',
      '--agent',
      'cli.agent',
      '--tool',
      'cli.echo',
      '--scope',
      'per-tenant',
      '--ttl',
      '7d',
      '--reason',
      'pilot',
      '--json',
    ]);
    expect(created.status).toBe(0);
    const grant = json(created);
    expect(grant).toMatchObject({ agent_id: 'cli.agent', tool_id: 'cli.echo', status: 'live', rationale: 'pilot' });
    expect(Date.parse(grant.expires_at) - before).toBeGreaterThanOrEqual(7 * 86_400_000);
    expect(Date.parse(grant.expires_at) - Date.now()).toBeLessThanOrEqual(7 * 86_400_000);
    grantId = grant.id;

    const call = await callAsAgent({ hello: 'world' });
    expect(call.stderr).toBe('');
    expect(call.status).toBe(0);
    expect(call.stdout).toMatch(/completed/);
    expect(call.stdout).toContain('{"echo":{"hello":"world"}}');
  }, 120_000);

  it('arms a switch that refuses the call, and disarms it by target', async () => {
    const armed = await toolgate([
      'switches',
      'arm',
      '--scope',
      'tool',
      '--target',
      'cli.echo',
      '--tenant',
      't1',
      '--reason',
      'incident 7',
      '--copy',
      'Echo is paused',
      '--json',
    ]);
    expect(armed.status).toBe(0);
    const switchId = json(armed).id;

    const refused = await callAsAgent({});
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain('toolgate: kill_switch_active: Echo is paused');

    const disarmed = await toolgate(['switches', 'disarm', '--target', 'cli.echo', '--reason', 'fixed']);
    expect(disarmed.status).toBe(0);
    expect(disarmed.stdout).toMatch(new RegExp(`${switchId}\\s+tool\\s+cli\\.echo\\s+t1\\s+disarmed`));
    expect((await callAsAgent({})).status).toBe(0);
  }, 120_000);

  it("escapes control characters in what it prints for people: a switch's reason and copy, a refusal's message", async () => {
    // Any control character but the newlines between lines.
    const raw = /[^\n\P{Cc}]|\p{Bidi_Control}/u;
    // OSC 52 sets the reader's clipboard; the CSI sequences and CR erase a line and write over it.
    const reason = 'incident\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\u0007';
    const copy = 'Paused\u001b[2K\u001b[1A\rforged\u202e';
    const armed = await fetch(`${url}/kill-switches`, {
      method: 'POST',
      headers: { authorization: `Bearer ${operator}`, 'content-type': 'application/json' },
      body: JSON.stringify({
        scope: 'agent',
        target: 'cli.agent',
        tenant_id: 't1',
        reason,
        user_visible_status_copy: copy,
      }),
    });
    expect(armed.status).toBe(201);

    const listed = await toolgate(['switches', 'list', '--target', 'cli.agent']);
    expect(listed.status).toBe(0);
    expect(listed.stdout).not.toMatch(raw);
    expect(listed.stdout.trim().split('\n')).toHaveLength(2);
    expect(listed.stdout).toContain('incident\\u001b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\u0007');

    const decided = await toolgate(['switches', 'decide', '--tenant', 't1', '--agent', 'cli.agent']);
    expect(decided.status).toBe(1);
    expect(decided.stdout).not.toMatch(raw);
    expect(decided.stdout).toContain('"Paused\\u001b[2K\\u001b[1A\\rforged\\u202e"');

    // --json is the API's answer, the same values once parsed.
    const asJson = await toolgate(['switches', 'list', '--target', 'cli.agent', '--json']);
    expect(asJson.stdout).not.toMatch(raw);
    expect(json(asJson).items[0]).toMatchObject({ reason, user_visible_status_copy: copy });

    // The refusal of a call shows the copy as its message.
    const refused = await callAsAgent({});
    expect(refused.status).toBe(1);
    expect(refused.stderr).not.toMatch(raw);
    expect(refused.stderr).toContain('toolgate: kill_switch_active: Paused\\u001b[2K\\u001b[1A\\rforged\\u202e\n');
    expect((await toolgate(['switches', 'disarm', '--target', 'cli.agent', '--reason', 'fixed'])).status).toBe(0);
  }, 120_000);

  it('revokes a grant by id, and every live grant of an agent for a tool, listing them', async () => {
    const byId = await toolgate(['grants', 'revoke', grantId, '--reason', 'rotated']);
    expect(byId.status).toBe(0);
    expect(byId.stdout).toMatch(new RegExp(`${grantId}\\s+cli\\.agent\\s+cli\\.echo\\s+per-tenant\\s+t1\\s+revoked`));

    const grants = [];
    for (const ref of ['s1', 's2']) {
      const created = await toolgate([
        'grants',
        'create',
        '--agent',
        'cli.agent',
        '--tool',
        'cli.echo',
        '--scope',
        'per-session',
        '--ref',
        ref,
        '--ttl',
        '1h',
        '--reason',
        'sessions',
        '--json',
      ]);
      grants.push(json(created).id);
    }
    const byMatch = await toolgate([
      'grants',
      'revoke',
      '--agent',
      'cli.agent',
      '--tool',
      'cli.echo',
      '--reason',
      'incident 8',
      '--json',
    ]);
    expect(byMatch.status).toBe(0);
    const revoked = json(byMatch).items;
    expect(revoked.map((g: { id: string }) => g.id).sort()).toEqual(grants.sort());
    expect(
      revoked.every(
        (g: { status: string; revocation_reason: string }) =>
          g.status === 'revoked' && g.revocation_reason === 'incident 8',
      ),
    ).toBe(true);

    const resolved = await toolgate([
      'grants',
      'resolve',
      '--agent',
      'cli.agent',
      '--tool',
      'cli.echo',
      '--session',
      's1',
    ]);
    expect(resolved.status).toBe(1);
    expect(resolved.stdout).toContain('cli.agent may not call cli.echo: grant_revoked');
  }, 120_000);

  it("exits non-zero on a refusal, with the API's code and message on stderr, and 2 on a usage mistake", async () => {
    const refused = await toolgate([
      'grants',
      'create',
      '--agent',
      'cli.agent',
      '--tool',
      'no.such.tool',
      '--scope',
      'per-tenant',
      '--ttl',
      '1d',
      '--reason',
      'x',
    ]);
    expect(refused.status).toBe(1);
    expect(refused.stdout).toBe('');
    expect(refused.stderr).toMatch(/^toolgate: tool_not_registered: .*no\.such\.tool/);

    const call = await callAsAgent({});
    expect(call.status).toBe(1);
    expect(call.stderr).toContain('toolgate: grant_revoked:');

    const unitless = await toolgate([
      'grants',
      'create',
      '--agent',
      'a',
      '--tool',
      't',
      '--scope',
      'per-tenant',
      '--ttl',
      '7',
      '--reason',
      'x',
    ]);
    expect(unitless.status).toBe(2);
    expect(unitless.stderr).toContain('expected a duration such as 90s, 15m, 12h, 7d or 2w');
  }, 120_000);

  it('names the URL it tried when no gateway answers there', async () => {
    const nowhere = `http://127.0.0.1:${await freePort()}`;
    const outcome = await toolgate(['tools', 'list', '--url', nowhere]);
    expect(outcome.status).toBe(3);
    expect(outcome.stderr).toBe(`toolgate: cannot reach the gateway at ${nowhere}/tools: ECONNREFUSED\n`);
  }, 30_000);

  it('follows the audit log as events are recorded', async () => {
    const tail = spawn(
      process.execPath,
      [join(root, 'bin', 'toolgate.js'), 'audit', 'tail', '--lines', '1', '--interval', '1s', '--json'],
      { cwd: root, env: bareEnv({ TOOLGATE_URL: url, TOOLGATE_TOKEN: operator }) },
    );
    let stdout = '';
    tail.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
    try {
      for (let i = 0; i < 600 && !stdout.includes('\n'); i += 1) await new Promise((r) => setTimeout(r, 50));
      await fetch(`${url}/kill-switches`, {
        method: 'POST',
        headers: { authorization: `Bearer ${operator}`, 'content-type': 'application/json' },
        body: JSON.stringify({
          scope: 'agent',
          target: 'someone',
          tenant_id: 't1',
          reason: 'tail',
          user_visible_status_copy: 'paused',
        }),
      });
      for (let i = 0; i < 600 && !stdout.includes('kill_switch.armed'); i += 1)
        await new Promise((r) => setTimeout(r, 50));
      const events = stdout
        .trim()
        .split('\n')
        .map((line) => JSON.parse(line) as { seq: number; event_type: string });
      expect(events.at(-1)?.event_type).toBe('kill_switch.armed');
      expect(events.map((e) => e.seq)).toEqual([...events.map((e) => e.seq)].sort((a, b) => a - b));
    } finally {
      tail.kill('SIGTERM');
    }
  }, 120_000);

  it('records a checkpoint and verifies only what came after it', async () => {
    const made = await toolgate(['audit', 'checkpoint', '--json']);
    expect(made.status).toBe(0);
    const checkpoint = json(made) as { id: string; seq: number };
    const listed = await toolgate(['audit', 'checkpoints']);
    expect(listed.stdout).toContain(`${checkpoint.id}  seq ${checkpoint.seq}`);
    const verified = await toolgate(['audit', 'verify', '--from-checkpoint', checkpoint.id]);
    expect(verified.status).toBe(0);
    // A new log is leaves only: its chain closed at its genesis, and the tree holds every record.
    expect(verified.stdout).toMatch(
      new RegExp(`^audit chain intact: 0 rows; from checkpoint ${checkpoint.id} at seq 0`),
    );
  }, 120_000);

  it('witnesses the log (a kept checkpoint, then the next checked to extend it) and proves a record is in it', async () => {
    const state = join(mkdtempSync(join(tmpdir(), 'toolgate-witness-')), 'witness.json');
    const first = await toolgate(['audit', 'witness', '--state', state]);
    expect(first.stderr).toBe('');
    expect(first.stdout).toMatch(/^checkpoint of \d+ leaves verified and kept/);
    const kept = JSON.parse(readFileSync(state, 'utf8')) as { size: number; root: string; verifier_key: string };
    // Something happens, and is sequenced into the tree within a round.
    expect((await toolgate(['audit', 'checkpoint'])).status).toBe(0);
    let second: Outcome | undefined;
    for (let i = 0; i < 50; i += 1) {
      second = await toolgate(['audit', 'witness', '--state', state, '--json']);
      if (json(second).tree_size > kept.size) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    expect(second!.status).toBe(0);
    expect(json(second!)).toMatchObject({ ok: true, previous_tree_size: kept.size });
    const now = JSON.parse(readFileSync(state, 'utf8')) as { size: number; root: string };
    expect(now.size).toBeGreaterThan(kept.size);

    // A kept checkpoint the log's tree does not extend (a root it never had) fails the witness, and is kept as it was.
    const forged = { ...now, root: Buffer.alloc(32, 7).toString('base64') };
    writeFileSync(state, JSON.stringify(forged));
    const refused = await toolgate(['audit', 'witness', '--state', state]);
    expect(refused.status).toBe(1);
    expect(refused.stderr).toContain('does not extend the kept one');
    expect(JSON.parse(readFileSync(state, 'utf8'))).toEqual(forged);

    const [event] = json(await toolgate(['audit', 'list', '--limit', '1', '--json'])).items as Array<{
      event_id: string;
    }>;
    let proved: Outcome | undefined;
    for (let i = 0; i < 50; i += 1) {
      proved = await toolgate(['audit', 'prove', event!.event_id]);
      if (proved.status === 0) break;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    expect(proved!.stderr).toBe('');
    expect(proved!.stdout).toMatch(
      new RegExp(`^record ${event!.event_id} is leaf \\d+ of the signed tree of \\d+ leaves`),
    );
    const wrongKey = await toolgate([
      'audit',
      'prove',
      event!.event_id,
      '--log-key',
      kept.verifier_key.replace(/\+[0-9a-f]{8}\+/, '+00000000+'),
    ]);
    expect(wrongKey.status).toBe(1);
    expect(wrongKey.stderr).toContain('not signed by its key');
  }, 120_000);

  it.skipIf(!hasPostgresServer)(
    'verifies the log, refuses to anchor a chain with no record, and detects a rewritten record (needs PostgreSQL: the test rewrites a row)',
    async () => {
      const anchor = join(mkdtempSync(join(tmpdir(), 'toolgate-anchor-')), 'anchor.json');
      const anchored = await toolgate(['audit', 'verify', '--anchor', anchor]);
      expect(anchored.status).toBe(2);
      expect(anchored.stderr).toContain('toolgate audit witness --state FILE');
      expect(existsSync(anchor)).toBe(false);
      const first = await toolgate(['audit', 'verify']);
      expect(first.status).toBe(0);
      expect(first.stdout).toMatch(/^audit chain intact: 0 rows; tree intact: \d+ of \d+ leaves checked/);

      const client = new pg.Client({ connectionString: databaseUrl });
      await client.connect();
      try {
        const { rows } = await client.query<{ seq: string }>('select seq from audit_leaves where leaf_index = 1');
        await client.query('alter table audit_events disable trigger audit_events_no_update_delete');
        await client.query(`update audit_events set actor = 'operator:someone-else' where seq = $1`, [rows[0]!.seq]);
        await client.query('alter table audit_events enable trigger audit_events_no_update_delete');
      } finally {
        await client.end();
      }
      const second = await toolgate(['audit', 'verify', '--json']);
      expect(second.status).toBe(1);
      expect(json(second)).toMatchObject({
        ok: false,
        tree: { ok: false, first_bad_leaf_index: 1, reason: 'record_changed' },
      });
      expect(second.stderr).toContain('toolgate: audit tree broken at leaf 1 (record_changed)');
    },
    120_000,
  );
});

describe('toolgate, against a gateway that answers oddly, and with secrets kept off the command line', () => {
  let fake: Server;
  let fakeUrl: string;
  const asked: Array<{ url: string; authorization: string | undefined }> = [];
  let seq = 0;

  beforeAll(async () => {
    // Every page of /tools names the same next page.
    fake = createServer((request, response) => {
      asked.push({ url: request.url ?? '', authorization: request.headers.authorization });
      response.setHeader('content-type', 'application/json');
      if (request.url?.startsWith('/tools'))
        response.end(JSON.stringify({ items: [{ id: 'loop.tool', version: '1.0.0' }], next_cursor: 'again' }));
      else if (request.url?.startsWith('/audit')) {
        seq += 1;
        const event = { seq, occurred_at: new Date().toISOString(), event_type: 'loop.event', actor: 'operator:x' };
        response.end(JSON.stringify({ items: [event], next_cursor: 'again' }));
      } else response.end(JSON.stringify({ kind: 'operator', id: 'fake' }));
    });
    await new Promise<void>((resolve) => fake.listen(0, '127.0.0.1', resolve));
    const address = fake.address() as { port: number };
    fakeUrl = `http://127.0.0.1:${address.port}`;
  });

  afterAll(async () => {
    await new Promise((resolve) => fake.close(resolve));
  });

  it('stops --all with an error when the gateway answers a next_cursor it gave before', async () => {
    asked.length = 0;
    const outcome = await toolgate(['tools', 'list', '--all', '--url', fakeUrl]);
    expect(outcome.status).toBe(1);
    expect(outcome.stderr).toBe(
      'toolgate: the gateway answered next_cursor again a second time; stopped instead of asking again\n',
    );
    expect(asked.map((a) => a.url)).toEqual(['/tools', '/tools?cursor=again']);

    // A cursor given with --cursor counts as followed.
    asked.length = 0;
    const resumed = await toolgate(['tools', 'list', '--all', '--cursor', 'again', '--url', fakeUrl]);
    expect(resumed.status).toBe(1);
    expect(asked.map((a) => a.url)).toEqual(['/tools?cursor=again']);

    // audit tail pages back to the last event it showed: the same guard.
    const tail = await toolgate(['audit', 'tail', '--lines', '1', '--interval', '1s', '--url', fakeUrl]);
    expect(tail.status).toBe(1);
    expect(tail.stdout).toMatch(/^1 \S+ loop\.event actor=operator:x [^\n]*\n$/);
    expect(tail.stderr).toContain('next_cursor again a second time');
  }, 120_000);

  it('takes the token from TOOLGATE_TOKEN, or from stdin with --token-stdin, and says so in --help', async () => {
    asked.length = 0;
    expect((await toolgate(['whoami', '--url', fakeUrl], { TOOLGATE_TOKEN: 'from-env' })).status).toBe(0);
    const piped = await toolgate(
      ['whoami', '--token-stdin', '--url', fakeUrl],
      { TOOLGATE_TOKEN: 'from-env' },
      'piped\n',
    );
    expect(piped.status).toBe(0);
    expect(asked.map((a) => a.authorization)).toEqual(['Bearer from-env', 'Bearer piped']);

    const both = await toolgate(['whoami', '--token-stdin', '--token', 'x', '--url', fakeUrl], {}, 'piped\n');
    expect([both.status, both.stderr]).toEqual([2, 'toolgate: give one of --token and --token-stdin\n']);
    const empty = await toolgate(['whoami', '--token-stdin', '--url', fakeUrl], {}, '\n');
    expect([empty.status, empty.stderr]).toEqual([2, 'toolgate: --token-stdin: expected one token on stdin\n']);
    expect(asked).toHaveLength(2);

    const help = await toolgate(['--help']);
    expect(help.stdout).toContain('TOOLGATE_TOKEN');
    expect(help.stdout).toMatch(/--token-stdin +read the bearer token from stdin/);
    expect(help.stdout).toMatch(/prefer TOOLGATE_TOKEN or\s+--token-stdin/);
  }, 120_000);

  it('never prints the user and password of a gateway URL', async () => {
    const withPassword = fakeUrl.replace('//', '//alice:s3cret@');
    for (const outcome of [
      await toolgate(['tools', 'list', '--url', withPassword]),
      await toolgate(['tools', 'list'], { TOOLGATE_URL: withPassword }),
      await toolgate(['tools', 'list', '--url', `${withPassword}:not-a-port`]),
      await toolgate(['tools', 'list', '--url', withPassword.replace('http://', '')]),
    ]) {
      expect(outcome.status).toBe(2);
      expect(outcome.stdout + outcome.stderr).not.toMatch(/alice|s3cret/);
      expect(outcome.stderr).toMatch(/^toolgate: --url or TOOLGATE_URL: /);
    }
  }, 120_000);
});
