import type { Command } from 'commander';
import { createToolgateClient, refusal, unwrap, type ToolgateClient } from '../../client/index.js';
import { loadClientTarget } from '../../config/config.js';
import { jsonText, printableLines, sayOnStderr } from './terminal.js';

export const DEFAULT_URL = 'http://127.0.0.1:8080';

/** A usage mistake the parser could not see (exit 2). */
export class UsageError extends Error {}

/** The answer was read and is a "no" that is not an API error (a broken chain, a denied resolution): exit 1. */
export class CheckFailed extends Error {}

/** The gateway answered something that cannot be followed (a `next_cursor` it gave before): exit 1. */
export class BadAnswer extends Error {}

/** The gateway's URL: a user or password in it would be printed with every error naming the URL. */
function gatewayUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new UsageError(`--url or TOOLGATE_URL: not a URL: ${text}`);
  }
  // Without a scheme, `user:pass@host` parses as a URL of scheme `user:`, and fails naming itself.
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new UsageError('--url or TOOLGATE_URL: expected an http:// or https:// URL');
  if (url.username || url.password)
    throw new UsageError(
      '--url or TOOLGATE_URL: leave the user and password out of the URL; the token goes in TOOLGATE_TOKEN',
    );
  return text.replace(/\/+$/, '');
}

/**
 * Follows a listing's `next_cursor` unless it was followed before: a gateway that answers one
 * again would otherwise be asked for the same page forever.
 */
export function followOnce(seen: Set<string>, cursor: string): string {
  if (seen.has(cursor))
    throw new BadAnswer(`the gateway answered next_cursor ${cursor} a second time; stopped instead of asking again`);
  seen.add(cursor);
  return cursor;
}

interface GlobalOptions {
  url?: string;
  token?: string;
  json?: boolean;
}

/** What every command that calls the gateway shares: where, as whom, and how to print. */
export class Session {
  readonly api: ToolgateClient;
  readonly url: string;
  readonly json: boolean;
  readonly token: string | undefined;

  constructor(command: Command) {
    const options = command.optsWithGlobals<GlobalOptions>();
    const target = loadClientTarget();
    this.url = gatewayUrl(options.url ?? target.url ?? DEFAULT_URL);
    this.token = options.token ?? target.token;
    this.json = options.json ?? false;
    this.api = createToolgateClient({ baseUrl: this.url, token: this.token });
  }

  /** The data of a successful call; a refusal is thrown as a `ToolgateError`. */
  call<T>(request: Promise<{ data?: T; error?: unknown; response: Response }>): Promise<T> {
    return unwrap(request);
  }

  /** A call whose refusals carry an answer worth printing (run envelopes): both ends, as they are. */
  async answer<T>(
    request: Promise<{ data?: T; error?: unknown; response: Response }>,
  ): Promise<{ ok: boolean; body: T; refusal?: ReturnType<typeof refusal> }> {
    const { data, error, response } = await request;
    if (response.ok) return { ok: true, body: data as T };
    return { ok: false, body: error as T, refusal: refusal(response.status, error) };
  }

  /** `--json`: the API's answer as it is; otherwise what `human` makes of it, escaped for a terminal. */
  print(value: unknown, human: () => string): void {
    const text = this.json ? jsonText(value, 2) : printableLines(human());
    if (text) process.stdout.write(`${text}\n`);
  }

  /** A note for people on stderr (stdout stays the answer), escaped as one line. */
  note(line: string): void {
    sayOnStderr(line);
  }

  /** Every item of a listing, following `next_cursor` while `all` is set (each cursor once). */
  async page<T>(
    all: boolean | undefined,
    fetchPage: (cursor: string | undefined) => Promise<{ items: T[]; next_cursor?: string | null }>,
    cursor?: string,
  ): Promise<{ items: T[]; next_cursor: string | null }> {
    const first = await fetchPage(cursor);
    if (!all) return { ...first, next_cursor: first.next_cursor ?? null };
    const items = [...first.items];
    const seen = new Set(cursor ? [cursor] : []);
    for (let next = first.next_cursor; next;) {
      const page = await fetchPage(followOnce(seen, next));
      items.push(...page.items);
      next = page.next_cursor;
    }
    return { items, next_cursor: null };
  }

  /** Tells people there is more (on stderr, so that stdout stays the listing). */
  more(nextCursor: string | null | undefined): void {
    if (nextCursor && !this.json) this.note(`more: --cursor ${nextCursor} (or --all)`);
  }
}
