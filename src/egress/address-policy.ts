import net from 'node:net';
import ipaddr from 'ipaddr.js';
import { CLOUD_METADATA_ADDRESSES } from './cloud-metadata.js';

type Address = ipaddr.IPv4 | ipaddr.IPv6;
type Cidr = [Address, number];

/** Why an address is not public. */
export type AddressClass =
  | 'unparseable'
  | 'cloud_metadata'
  | 'unspecified'
  | 'this_network'
  | 'loopback'
  | 'private'
  | 'carrier_grade_nat'
  | 'link_local'
  | 'unique_local'
  | 'site_local'
  | 'multicast'
  | 'broadcast'
  | 'benchmarking'
  | 'documentation'
  | 'reserved'
  | 'discard'
  | 'ipv4_compatible'
  | 'ipv4_translated'
  | 'nat64_local_use'
  | 'not_global_unicast'
  | 'special_purpose';

/** How an IPv4 address was carried inside the IPv6 address that was checked. */
export type AddressEmbedding = 'ipv4_mapped' | 'nat64' | '6to4' | 'teredo';

/** The refusal part of a verdict: the class, and for embedded forms, what was embedded and how. */
export interface AddressClassification {
  classification: AddressClass;
  via?: AddressEmbedding;
  embedded?: string;
  /** ipaddr.js's own name, when only its range table (not ours) refused the address. */
  range?: string;
}

/**
 * The verdict on one address. When admitted, `address` is the canonical form to connect to
 * (IPv4-mapped addresses become the IPv4 address they carry) and `excepted` says whether only an
 * operator's exception CIDR let it through.
 */
export type AddressVerdict =
  | { ok: true; address: string; family: 4 | 6; excepted: boolean }
  | ({ ok: false; address: string } & AddressClassification);

/** Decides whether the gateway may connect to an address (docs/api.md#egress-guard-external_call-tools). */
export type AddressPolicy = (address: string) => AddressVerdict;

const cidr = (text: string): Cidr => ipaddr.parseCIDR(text);

/**
 * What is not public, from the IANA special-purpose registries, checked before ipaddr.js's `range()`
 * (which calls `::127.0.0.1` unicast). First match wins, so narrower entries come first.
 */
const NOT_PUBLIC: ReadonlyArray<readonly [Cidr, AddressClass]> = (
  [
    ['0.0.0.0/32', 'unspecified'],
    ['0.0.0.0/8', 'this_network'],
    ['10.0.0.0/8', 'private'],
    ['100.64.0.0/10', 'carrier_grade_nat'],
    ['127.0.0.0/8', 'loopback'],
    ['169.254.0.0/16', 'link_local'],
    ['172.16.0.0/12', 'private'],
    ['192.0.0.0/24', 'reserved'], // IETF protocol assignments: DS-Lite, NAT64 discovery, ...
    ['192.0.2.0/24', 'documentation'],
    ['192.88.99.0/24', 'reserved'], // the deprecated 6to4 relay anycast
    ['192.168.0.0/16', 'private'],
    ['198.18.0.0/15', 'benchmarking'],
    ['198.51.100.0/24', 'documentation'],
    ['203.0.113.0/24', 'documentation'],
    ['224.0.0.0/4', 'multicast'],
    ['255.255.255.255/32', 'broadcast'],
    ['240.0.0.0/4', 'reserved'],
    ['::/128', 'unspecified'],
    ['::1/128', 'loopback'],
    ['::/96', 'ipv4_compatible'],
    ['::ffff:0:0:0/96', 'ipv4_translated'],
    ['64:ff9b:1::/48', 'nat64_local_use'], // its embedding is site-defined, so it cannot be judged
    ['100::/64', 'discard'],
    ['2001:2::/48', 'benchmarking'],
    ['2001:db8::/32', 'documentation'],
    ['3fff::/20', 'documentation'],
    ['2001::/23', 'reserved'], // IETF protocol assignments
    ['fc00::/7', 'unique_local'],
    ['fe80::/10', 'link_local'],
    ['fec0::/10', 'site_local'],
    ['ff00::/8', 'multicast'],
  ] as const
).map(([text, name]) => [cidr(text), name] as const);

/** Global unicast IPv6 space; everything outside it is unallocated or special. */
const GLOBAL_UNICAST_V6 = cidr('2000::/3');

const ipv4 = (high: number, low: number) => new ipaddr.IPv4([high >> 8, high & 0xff, low >> 8, low & 0xff]);

/**
 * IPv6 forms that carry an IPv4 address the packets end up at: judged by what they carry, so
 * NAT64 of a public host (what DNS64 networks hand out) passes and NAT64 of 127.0.0.1 does not.
 * Checked before the table because 2001::/32 (Teredo) sits inside 2001::/23.
 */
interface Embedding {
  via: AddressEmbedding;
  range: Cidr;
  carried: (parts: number[]) => ipaddr.IPv4[];
}
const EMBEDDINGS: readonly Embedding[] = [
  { via: 'nat64', range: cidr('64:ff9b::/96'), carried: (p) => [ipv4(p[6]!, p[7]!)] },
  { via: '6to4', range: cidr('2002::/16'), carried: (p) => [ipv4(p[1]!, p[2]!)] },
  // Teredo: the server address as is, the client address bit-inverted (RFC 4380 §4).
  {
    via: 'teredo',
    range: cidr('2001::/32'),
    carried: (p) => [ipv4(p[2]!, p[3]!), ipv4(p[6]! ^ 0xffff, p[7]! ^ 0xffff)],
  },
];

const METADATA = CLOUD_METADATA_ADDRESSES.map((text) => ipaddr.parse(text));

function within(address: Address, [network, bits]: Cidr): boolean {
  return address.kind() === network.kind() && address.match(network, bits);
}

function isMetadata(address: Address): boolean {
  return METADATA.some((entry) => within(address, [entry, entry.kind() === 'ipv4' ? 32 : 128]));
}

/**
 * Why an address is not public, or `undefined` if it is. Operator exceptions play no part here.
 * IPv4-mapped addresses must be unmapped by the caller (`ipaddr.process` semantics).
 */
function classifyAddress(address: Address): AddressClassification | undefined {
  if (isMetadata(address)) return { classification: 'cloud_metadata' };
  if (address.kind() === 'ipv6') {
    const parts = (address as ipaddr.IPv6).parts;
    for (const embedding of EMBEDDINGS) {
      if (!within(address, embedding.range)) continue;
      for (const carried of embedding.carried(parts)) {
        const inner = classifyAddress(carried);
        if (inner) return { ...inner, via: embedding.via, embedded: carried.toString() };
      }
      return undefined;
    }
  }
  const listed = NOT_PUBLIC.find(([range]) => within(address, range));
  if (listed) return { classification: listed[1] };
  if (address.kind() === 'ipv6' && !within(address, GLOBAL_UNICAST_V6)) {
    return { classification: 'not_global_unicast' };
  }
  // Second opinion: anything ipaddr.js knows as special that our table does not (AS112, AMT, ...).
  const range = address.range();
  if (range !== 'unicast') return { classification: 'special_purpose', range };
  return undefined;
}

function parseException(text: string): Cidr {
  try {
    return ipaddr.parseCIDR(text);
  } catch {
    throw new Error(`invalid egress exception CIDR "${text}" (expected e.g. 10.1.0.0/16)`);
  }
}

/**
 * Builds the address policy: refuse every address that is not public, unless an exception CIDR
 * covers it; never admit a cloud metadata address. Only canonical address text is accepted (what
 * `dns.lookup` and the URL parser produce): anything else would be re-resolved by the socket layer.
 */
export function createAddressPolicy(allowCidrs: readonly string[]): AddressPolicy {
  const exceptions = allowCidrs.map(parseException);
  return (text) => {
    if (net.isIP(text) === 0) return { ok: false, address: text, classification: 'unparseable' };
    const parsed = ipaddr.parse(text);
    const mapped = parsed.kind() === 'ipv6' && (parsed as ipaddr.IPv6).isIPv4MappedAddress();
    const address = mapped ? (parsed as ipaddr.IPv6).toIPv4Address() : parsed;
    const embedding = mapped ? { via: 'ipv4_mapped' as const, embedded: address.toString() } : {};

    const refusal = classifyAddress(address);
    // No exception CIDR, however wide, opens a metadata address.
    const exceptable = refusal?.classification !== 'cloud_metadata';
    const excepted = exceptable && exceptions.some((range) => within(address, range));
    if (refusal && !excepted) return { ok: false, address: text, ...embedding, ...refusal };
    return { ok: true, address: address.toString(), family: address.kind() === 'ipv4' ? 4 : 6, excepted };
  };
}
