import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));

/**
 * Starts a real gateway process (`src/server.ts`) on `port` and resolves once `/ready` answers
 * 200; stops it and throws if it never does.
 */
export async function startGateway(options: {
  databaseUrl: string;
  port: number;
  secret: string;
  env?: Record<string, string>;
}): Promise<ChildProcess> {
  // BENCH_NODE_ARGS: extra Node flags for the gateway, e.g. "--cpu-prof --cpu-prof-dir=/tmp/prof".
  const nodeArgs = (process.env.BENCH_NODE_ARGS ?? '').split(' ').filter(Boolean);
  const child = spawn(process.execPath, [...nodeArgs, '--import', 'tsx', 'src/server.ts'], {
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
  });
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
