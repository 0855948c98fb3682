import dns from 'node:dns';
import type { AddressPolicy } from './address-policy.js';
import { denied, failed, type EgressDenied, type EgressFailed } from './egress-result.js';

/** One answer of a resolver, as `dns.lookup` gives it. */
export interface ResolvedAddress {
  address: string;
  family: 4 | 6;
}

/**
 * Turns a host name into every address it has. A name that does not exist is an empty answer or
 * an error with code `ENOTFOUND`/`ENODATA`; any other error is a resolver fault. Injected in tests
 * and by sites with their own resolution; the default is `systemResolver`.
 */
export type Resolver = (hostname: string) => Promise<ResolvedAddress[]>;

/** `dns.lookup` with `all: true`: the system resolver, so `/etc/hosts` and host aliases apply. */
export const systemResolver: Resolver = async (hostname) => {
  const answers = await dns.promises.lookup(hostname, { all: true });
  return answers.map(({ address, family }) => ({ address, family: family === 6 ? 6 : 4 }));
};

const NOT_FOUND = new Set(['ENOTFOUND', 'ENODATA', 'EAI_NONAME', 'EAI_NODATA']);

/** Addresses that passed the address policy, in canonical form: the only ones a socket may use. */
export type CheckedAddresses = { ok: true; addresses: ResolvedAddress[] } | EgressDenied | EgressFailed;

/**
 * Resolves a host (an IP literal is its own answer) and checks **every** address against the
 * policy: one private answer among public ones refuses the host, since the socket could pick it.
 */
export async function resolveAndCheck(
  host: string,
  ipLiteral: boolean,
  resolver: Resolver,
  policy: AddressPolicy,
): Promise<CheckedAddresses> {
  let answers: ResolvedAddress[];
  if (ipLiteral) {
    answers = [{ address: host, family: host.includes(':') ? 6 : 4 }];
  } else {
    try {
      answers = await resolver(host);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException | undefined)?.code;
      if (code && NOT_FOUND.has(code)) return denied('host_unresolvable', { host, resolver_code: code });
      return failed('dns_failed', { host, resolver_code: code ?? 'unknown' });
    }
    if (answers.length === 0) return denied('host_unresolvable', { host });
  }

  const addresses: ResolvedAddress[] = [];
  for (const answer of answers) {
    const verdict = policy(answer.address);
    if (!verdict.ok) {
      const { ok: _ok, ...refusal } = verdict;
      return denied('address_not_public', { host, ...refusal, resolved: answers.map((a) => a.address) });
    }
    addresses.push({ address: verdict.address, family: verdict.family });
  }
  return { ok: true, addresses };
}
