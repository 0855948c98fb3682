import { AsyncLocalStorage } from 'node:async_hooks';
import type { ServerEvent, ServerEventBus } from '@modelcontextprotocol/server';

/** Whose listen stream a subscription is. */
export interface Listener {
  tenantId: string;
  agentId: string;
}

interface Subscription {
  deliver: (event: ServerEvent) => void;
  who: Listener | undefined;
}

/**
 * The bus `subscriptions/listen` streams subscribe to, knowing whose each stream is, so that a change is told only to
 * the listeners it concerns (a grant to its agent, a tenant policy to its tenant). The SDK subscribes while it serves
 * the listen request, inside `within`, which is how a subscription learns its listener.
 */
export class ListenerBus implements ServerEventBus {
  private readonly subscriptions = new Set<Subscription>();
  private readonly current = new AsyncLocalStorage<Listener>();

  constructor(private readonly onerror: (error: unknown) => void) {}

  /** Runs `serve` (one request) as `listener`: a listen stream it opens is that listener's. */
  within<T>(listener: Listener, serve: () => T): T {
    return this.current.run(listener, serve);
  }

  /** Tells every listener. */
  publish(event: ServerEvent): void {
    this.publishTo(() => true, event, true);
  }

  /** Tells the listeners `concerned` accepts; a stream of no known listener hears only what everyone hears. */
  publishTo(concerned: (who: Listener) => boolean, event: ServerEvent, everyone = false): void {
    for (const subscription of [...this.subscriptions]) {
      if (!everyone && (subscription.who === undefined || !concerned(subscription.who))) continue;
      try {
        subscription.deliver(event);
      } catch (error) {
        this.onerror(error);
      }
    }
  }

  subscribe(deliver: (event: ServerEvent) => void): () => void {
    const subscription: Subscription = { deliver, who: this.current.getStore() };
    this.subscriptions.add(subscription);
    return () => {
      this.subscriptions.delete(subscription);
    };
  }

  get listenerCount(): number {
    return this.subscriptions.size;
  }

  /** The open streams of one agent. */
  countOf(listener: Listener): number {
    let count = 0;
    for (const { who } of this.subscriptions)
      if (who?.tenantId === listener.tenantId && who.agentId === listener.agentId) count += 1;
    return count;
  }

  /** The listeners with a stream open, each once. */
  listeners(): Listener[] {
    const seen = new Map<string, Listener>();
    for (const { who } of this.subscriptions) if (who) seen.set(JSON.stringify([who.tenantId, who.agentId]), who);
    return [...seen.values()];
  }
}
