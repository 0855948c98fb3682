import { createServer, connect, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';

/**
 * A TCP proxy on loopback in front of PostgreSQL, so a test can take the database away from one
 * gateway instance — cut: drop every connection and refuse new ones; or freeze: a silent
 * partition, where connections stay open but nothing crosses them and new ones get no answer —
 * and give it back (restore).
 */
export class TcpProxy {
  private server: Server | undefined;
  private readonly sockets = new Set<Socket>();
  private readonly links: Array<[Socket, Socket]> = [];
  private mode: 'open' | 'cut' | 'frozen' = 'open';
  port = 0;

  constructor(
    private readonly targetHost: string,
    private readonly targetPort: number,
  ) {}

  async start(): Promise<this> {
    this.server = createServer((client) => {
      if (this.mode === 'cut') {
        client.destroy();
        return;
      }
      this.track(client);
      this.accepted += 1;
      if (this.mode === 'frozen') {
        // Accepted, never answered: as a connection attempt into a partition.
        client.pause();
        return;
      }
      const upstream = connect(this.targetPort, this.targetHost);
      this.track(upstream);
      client.pipe(upstream).pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
      this.links.push([client, upstream]);
    });
    await new Promise<void>((resolve) => this.server!.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as AddressInfo).port;
    return this;
  }

  /** How many connections the proxy has accepted from its clients so far. */
  accepted = 0;

  private track(socket: Socket): void {
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => socket.destroy());
  }

  /** The URL to reach `databaseUrl`'s server through this proxy. */
  urlFor(databaseUrl: string): string {
    const url = new URL(databaseUrl);
    url.hostname = '127.0.0.1';
    url.port = String(this.port);
    return url.toString();
  }

  cutConnections(): void {
    this.mode = 'cut';
    for (const socket of this.sockets) socket.destroy();
  }

  /** Nothing crosses any connection any more, and nothing is closed: queries wait for an answer. */
  freeze(): void {
    this.mode = 'frozen';
    for (const [client, upstream] of this.links.splice(0)) {
      client.unpipe(upstream);
      upstream.unpipe(client);
      client.pause();
      upstream.pause();
    }
  }

  /**
   * New connections work again; connections frozen meanwhile are closed (as keep-alive would find
   * them dead), or with `keepFrozen` stay open and silent, as before keep-alive has found out.
   */
  restore(options: { keepFrozen?: boolean } = {}): void {
    if (this.mode === 'frozen' && !options.keepFrozen) for (const socket of this.sockets) socket.destroy();
    this.mode = 'open';
  }

  async close(): Promise<void> {
    this.cutConnections();
    await new Promise<void>((resolve) => (this.server ? this.server.close(() => resolve()) : resolve()));
  }
}
