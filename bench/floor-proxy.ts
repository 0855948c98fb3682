/**
 * The bench's floor: the least any gateway meeting toolgate's audit contract could do per call,
 * measured on the same machine in the same run as the gateway. An HTTP proxy on loopback that,
 * for each POST, commits one row to PostgreSQL durably (the intent record), forwards the body to
 * the backend over a keep-alive pool, commits a second row durably (the outcome record), then
 * answers. No authentication, no admission, no budget, no rate limit, no hash chain, no group
 * commit: what it adds to a call is the price of two durable commits and one proxy hop here.
 * With FLOOR_COMMITS=0 it commits nothing: a bare proxy hop.
 *
 * Run as its own process (like the gateway): `tsx bench/floor-proxy.ts`, with DATABASE_URL,
 * PORT, BACKEND_URL and FLOOR_COMMITS in the environment. Prints "ready" once it listens.
 */
import { createServer } from 'node:http';
import pg from 'pg';
import { Pool } from 'undici';

const commits = Number(process.env.FLOOR_COMMITS ?? 2);
const db = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 16 });
const backend = new Pool(process.env.BACKEND_URL!, { connections: 128 });
await db.query(
  'create table if not exists bench_floor (id bigserial primary key, kind text not null, at timestamptz not null default now())',
);

const record = (kind: string) =>
  db.query({ name: 'floor-record', text: 'insert into bench_floor (kind) values ($1)', values: [kind] });

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => {
    void (async () => {
      try {
        if (commits > 0) await record('intent');
        const answer = await backend.request({
          path: req.url!,
          method: 'POST',
          body: Buffer.concat(chunks),
          headers: { 'content-type': 'application/json' },
        });
        const body = await answer.body.text();
        if (commits > 1) await record('outcome');
        res.writeHead(answer.statusCode, { 'content-type': 'application/json' });
        res.end(body);
      } catch (error) {
        res.writeHead(503, { 'content-type': 'text/plain' });
        res.end(String(error));
      }
    })();
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(process.env.PORT), '127.0.0.1', () => console.log('ready'));
process.on('SIGTERM', () => {
  server.close();
  void Promise.all([db.end(), backend.close()]).finally(() => process.exit(0));
});
