import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { until } from './waits.js';

export interface BackendHit {
  path: string;
  /** The query string as received, without its `?` (empty when there is none). */
  query: string;
  method: string;
  headers: IncomingHttpHeaders;
  body: unknown;
}

/**
 * A real HTTP tool backend on loopback, recording every request it receives. Paths:
 * `/echo` answers `{echo: <body>}`; `/hang` never answers; `/status/500`; `/html`; `/big`
 * (10 MB of JSON); `/wrong-shape` (`{unexpected: true}`); `/cost/<n>` reports its cost in a header;
 * `/gate` holds every request until `openGate()`, and `/gate/cost/<n>` then reports its cost.
 */
export class TestBackend {
  readonly hits: BackendHit[] = [];
  private server: Server | undefined;
  private readonly hanging = new Set<ServerResponse>();
  private gated: Array<() => void> = [];
  url = '';

  async start(): Promise<this> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (chunk: Buffer) => chunks.push(chunk));
      req.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let body: unknown = text;
        try {
          body = text ? JSON.parse(text) : null;
        } catch {
          // keep the text
        }
        const target = req.url ?? '/';
        const mark = target.indexOf('?');
        const path = mark < 0 ? target : target.slice(0, mark);
        const query = mark < 0 ? '' : target.slice(mark + 1);
        this.hits.push({ path, query, method: req.method ?? 'GET', headers: req.headers, body });
        this.answer(path, body, res);
      });
    });
    this.server.keepAliveTimeout = 1000;
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  private answer(path: string, body: unknown, res: ServerResponse): void {
    const json = (status: number, value: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(status, { 'content-type': 'application/json', ...headers });
      res.end(JSON.stringify(value));
    };
    if (path === '/echo') return json(200, { echo: body });
    if (path === '/hang') {
      this.hanging.add(res);
      return;
    }
    const gatedCost = /^\/gate\/cost\/(\d+(?:\.\d+)?)$/.exec(path);
    if (path === '/gate' || gatedCost) {
      this.gated.push(() => json(200, { echo: body }, gatedCost ? { 'x-toolgate-cost-units': gatedCost[1]! } : {}));
      return;
    }
    if (path === '/status/500') return json(500, { error: 'boom' });
    if (path === '/html') {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html><body>hello</body></html>');
      return;
    }
    if (path === '/big') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ echo: 'x'.repeat(10 * 1024 * 1024) }));
      return;
    }
    if (path === '/wrong-shape') return json(200, { unexpected: true });
    const cost = /^\/cost\/(\d+(?:\.\d+)?)$/.exec(path);
    if (cost) return json(200, { echo: body }, { 'x-toolgate-cost-units': cost[1]! });
    return json(404, { error: 'no such path' });
  }

  /** Answers every request waiting at `/gate`. */
  openGate(): void {
    for (const answer of this.gated.splice(0)) answer();
  }

  /** Resolves once `count` requests have reached `path`. */
  waitForHits(path: string, count: number, timeoutMs = 10_000): Promise<void> {
    return until(`${count} hits on ${path}`, () => this.hitsOn(path).length >= count, { timeoutMs });
  }

  hitsOn(path: string): BackendHit[] {
    return this.hits.filter((hit) => hit.path === path);
  }

  /** The requests sent for run `runId` (its `x-toolgate-run-id` header), in order. */
  hitsOfRun(runId: string): BackendHit[] {
    return this.hits.filter((hit) => hit.headers['x-toolgate-run-id'] === runId);
  }

  async close(): Promise<void> {
    for (const res of this.hanging) res.destroy();
    this.server?.closeAllConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
