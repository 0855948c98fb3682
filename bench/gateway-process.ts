import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

const root = fileURLToPath(new URL('..', import.meta.url));
let built = false;

/**
 * Compiles the gateway (`npm run build`, into `dist/`) once per bench run, so that the processes
 * measured are what production runs (`node dist/server.js`, as in the Docker image), not the
 * TypeScript loader.
 */
function buildOnce(): void {
  if (built) return;
  execFileSync(
    process.execPath,
    [fileURLToPath(new URL('../node_modules/typescript/bin/tsc', import.meta.url)), '-p', 'tsconfig.build.json'],
    {
      cwd: root,
      stdio: 'inherit',
    },
  );
  built = true;
}

/**
 * Starts a real gateway process (`dist/server.js`, built first) on `port` and resolves once
 * `/ready` answers 200; stops it and throws if it never does.
 */
export async function startGateway(options: {
  databaseUrl: string;
  port: number;
  secret: string;
  env?: Record<string, string>;
}): Promise<ChildProcess> {
  // BENCH_NODE_ARGS: extra Node flags for the gateway, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof".
  const nodeArgs = (process.env.BENCH_NODE_ARGS ?? '').split(' ').filter(Boolean);
  buildOnce();
  // The flags the Docker image runs the gateway with (see its NODE_OPTIONS and CMD).
  const child = spawn(
    process.execPath,
    ['--max-semi-space-size=32', '--max-old-space-size=1024', ...nodeArgs, 'dist/server.js'],
    {
      cwd: root,
      env: {
        ...process.env,
        DATABASE_URL: options.databaseUrl,
        PORT: String(options.port),
        TOOLGATE_JWT_SECRET: options.secret,
        LOG_LEVEL: 'warn',
        ...options.env,
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  for (let i = 0; i < 300; i += 1) {
    try {
      if ((await fetch(`http://127.0.0.1:${options.port}/ready`)).ok) return child;
    } catch {
      // not up yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill('SIGTERM');
  throw new Error(`gateway on ${options.port} did not become ready`);
}

/** A fresh database on the server at `serverUrl` for one bench run; `drop` removes it. */
export async function createBenchDatabase(serverUrl: string): Promise<{ url: string; drop: () => Promise<void> }> {
  const admin = new pg.Client({ connectionString: serverUrl });
  await admin.connect();
  const name = `toolgate_bench_${randomBytes(4).toString('hex')}`;
  await admin.query(`CREATE DATABASE ${name}`);
  const url = new URL(serverUrl);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: async () => {
      await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).catch(() => undefined);
      await admin.end();
    },
  };
}

/**
 * Starts the bench's floor (bench/floor-proxy.ts) as its own process on `port`, in front of
 * `backendUrl`: a proxy that commits `commits` rows durably per call (0, 1 or 2) and nothing else.
 */
export async function startFloorProxy(options: {
  databaseUrl: string;
  backendUrl: string;
  port: number;
  commits: number;
}): Promise<ChildProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'bench/floor-proxy.ts'], {
    cwd: root,
    env: {
      ...process.env,
      DATABASE_URL: options.databaseUrl,
      BACKEND_URL: options.backendUrl,
      PORT: String(options.port),
      FLOOR_COMMITS: String(options.commits),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`floor proxy on ${options.port} did not start`)), 30_000);
    child.once('exit', (code) => reject(new Error(`floor proxy exited (${code})`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
  }).catch((error: unknown) => {
    child.kill('SIGTERM');
    throw error;
  });
  return child;
}
