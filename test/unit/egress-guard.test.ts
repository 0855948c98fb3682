import { describe, expect, it } from 'vitest';
import { createAddressPolicy } from '../../src/egress/address-policy.js';
import { guardHop, prepareRequest, type GuardContext } from '../../src/egress/egress-guard.js';
import type { EgressNarrowing, EgressPolicy } from '../../src/egress/egress-policy.js';
import type { ResolvedAddress, Resolver } from '../../src/egress/resolver.js';

const PUBLIC_V4 = '8.8.8.8';
const PUBLIC_V6 = '2001:4860:4860::8888';

/** A resolver from a table; names missing from it do not exist. */
function tableResolver(table: Record<string, string[]>): Resolver {
  return async (hostname) => {
    const addresses = table[hostname];
    if (!addresses) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${hostname}`), { code: 'ENOTFOUND' });
    return addresses.map((address): ResolvedAddress => ({ address, family: address.includes(':') ? 6 : 4 }));
  };
}

const anyHost: EgressPolicy = { allowed_hosts: ['*'], schemes: ['http', 'https'] };

async function guard(
  url: string,
  {
    resolver = tableResolver({}),
    allowCidrs = [] as string[],
    policy = anyHost,
    narrowing = {} as EgressNarrowing,
  } = {},
) {
  const context: GuardContext = { resolver, addressPolicy: createAddressPolicy(allowCidrs) };
  return guardHop({ url, method: 'GET', headers: {} }, policy, narrowing, context);
}

describe('guard: IP literals are judged as the parser reads them', () => {
  it.each([
    // PayloadsAllTheThings README, "Default Targets".
    ['http://127.0.0.1:80', 'loopback'],
    ['http://0.0.0.0:80', 'unspecified'],
    // PayloadsAllTheThings README, "Bypass Localhost with IPv6 Notation".
    ['http://[::]:80/', 'unspecified'],
    ['http://[0000::1]:80/', 'loopback'],
    ['http://[0:0:0:0:0:ffff:127.0.0.1]', 'loopback'],
    ['http://[::ffff:127.0.0.1]', 'loopback'],
    // PayloadsAllTheThings README, "Bypass Localhost with CIDR".
    ['http://127.127.127.127', 'loopback'],
    ['http://127.0.1.3', 'loopback'],
    ['http://127.0.0.0', 'loopback'],
    // PayloadsAllTheThings README, "Bypass Using Rare Address".
    ['http://0/', 'unspecified'],
    ['http://127.1', 'loopback'],
    ['http://127.0.1', 'loopback'],
    // PayloadsAllTheThings README, "Bypass Using an Encoded IP Address" (decimal and octal).
    ['http://2130706433/', 'loopback'],
    ['http://3232235521/', 'private'],
    ['http://3232235777/', 'private'],
    ['http://2852039166/', 'cloud_metadata'],
    ['http://0177.0.0.1/', 'loopback'],
    // Hex and mixed encodings, as ipfuscator-style tools generate them (PayloadsAllTheThings README, Tools).
    ['http://0x7f.1/', 'loopback'],
    ['http://0x7f000001/', 'loopback'],
    ['http://0x7f.0x0.0x0.0x1/', 'loopback'],
    ['http://0177.0.0.0x1/', 'loopback'],
    // PayloadsAllTheThings README, "Bypass Using Different Encoding": enclosed alphanumerics.
    ['http://①②⑦.⓪.⓪.①/', 'loopback'],
    // Percent-encoded host: the parser decodes it before reading the IPv4 address.
    ['http://%31%32%37.0.0.1/', 'loopback'],
    // PayloadsAllTheThings, SSRF-Cloud-Instances.md, "Encoding the IP to bypass WAF".
    ['http://0xA9.0xFE.0xA9.0xFE', 'cloud_metadata'],
    ['http://0xA9FEA9FE', 'cloud_metadata'],
    ['http://0251.0376.0251.0376', 'cloud_metadata'],
    ['http://0251.00376.000251.0000376', 'cloud_metadata'],
    ['http://0251.254.169.254', 'cloud_metadata'],
    ['http://[::ffff:a9fe:a9fe]', 'cloud_metadata'],
    ['http://[0:0:0:0:0:ffff:a9fe:a9fe]', 'cloud_metadata'],
    ['http://[0:0:0:0:0:ffff:169.254.169.254]', 'cloud_metadata'],
    ['http://[fd00:ec2::254]/latest/meta-data/', 'cloud_metadata'],
    ['http://169.254.169.254/latest/meta-data/iam/security-credentials', 'cloud_metadata'],
    ['http://169.254.170.2/v2/credentials/', 'cloud_metadata'],
    ['http://192.0.0.192/latest/', 'cloud_metadata'],
    ['http://100.100.100.200/latest/meta-data/', 'cloud_metadata'],
    // ssrf-req-filter, test/fixtures/blockedUrls.js: ranges ipaddr.js < 2.5 called unicast, and more.
    ['http://[fec0::1]', 'site_local'],
    ['http://[64:ff9b:1::1]', 'nat64_local_use'],
    ['http://[3fff::1]', 'documentation'],
    ['http://[5f00::1]', 'not_global_unicast'],
    ['http://100.64.0.1', 'carrier_grade_nat'],
    ['http://255.255.255.255', 'broadcast'],
    ['http://224.0.0.1', 'multicast'],
    ['http://192.0.0.8', 'reserved'],
    ['http://[ff00::1]', 'multicast'],
    ['http://[fc00::1]', 'unique_local'],
    ['http://[0100::1]', 'discard'],
    ['http://[2002::1]', 'unspecified'], // 6to4 of 0.0.0.0
    ['http://[2001:0:1::1]', 'this_network'], // Teredo whose server is 0.1.0.0
    // IPv4-compatible (RFC 4291 §2.5.5.1, deprecated) and NAT64 (RFC 6052) spellings of loopback.
    ['http://[::127.0.0.1]/', 'ipv4_compatible'],
    ['http://[64:ff9b::127.0.0.1]/', 'loopback'],
  ])('refuses %s as %s', async (url, classification) => {
    expect(await guard(url)).toMatchObject({
      ok: false,
      code: 'egress_denied',
      reason: 'address_not_public',
      details: { classification },
    });
  });

  it('admits a public IP literal and pins exactly it', async () => {
    expect(await guard(`http://${PUBLIC_V4}/`)).toMatchObject({
      ok: true,
      hop: { target: { host: PUBLIC_V4, ipLiteral: true }, addresses: [{ address: PUBLIC_V4, family: 4 }] },
    });
  });
});

describe('guard: every address a name resolves to must be public', () => {
  const resolver = tableResolver({
    'api.example.com': [PUBLIC_V4, PUBLIC_V6],
    'mixed.example.com': [PUBLIC_V4, '10.0.0.7'],
    // Real answers of the rebinding-style names in ssrf-req-filter's blockedUrls.js and
    // PayloadsAllTheThings' "Bypass Localhost with a Domain Redirect" table.
    'localtest.me': ['127.0.0.1', '::1'],
    'customer1.app.localhost.my.company.127.0.0.1.nip.io': ['127.0.0.1'],
    '169.254.169.254.nip.io': ['169.254.169.254'],
    'v6mapped.example.com': ['::ffff:192.168.0.1'],
  });

  it('admits a name whose every address is public, pinning all of them', async () => {
    expect(await guard('https://api.example.com/', { resolver })).toMatchObject({
      ok: true,
      hop: {
        addresses: [
          { address: PUBLIC_V4, family: 4 },
          { address: PUBLIC_V6, family: 6 },
        ],
      },
    });
  });

  it('refuses a name with one private answer among public ones', async () => {
    expect(await guard('https://mixed.example.com/', { resolver })).toMatchObject({
      reason: 'address_not_public',
      details: {
        host: 'mixed.example.com',
        address: '10.0.0.7',
        classification: 'private',
        resolved: [PUBLIC_V4, '10.0.0.7'],
      },
    });
  });

  it.each([
    ['http://localtest.me', 'loopback'],
    ['http://customer1.app.localhost.my.company.127.0.0.1.nip.io', 'loopback'],
    ['http://169.254.169.254.nip.io/', 'cloud_metadata'],
    ['http://v6mapped.example.com/', 'private'],
  ])('refuses %s, which resolves to a %s address', async (url, classification) => {
    expect(await guard(url, { resolver })).toMatchObject({ reason: 'address_not_public', details: { classification } });
  });

  it('refuses a name that does not resolve, whether the resolver says so by error or by silence', async () => {
    expect(await guard('https://nowhere.example.com/', { resolver })).toMatchObject({
      code: 'egress_denied',
      reason: 'host_unresolvable',
      details: { resolver_code: 'ENOTFOUND' },
    });
    expect(await guard('https://empty.example.com/', { resolver: async () => [] })).toMatchObject({
      reason: 'host_unresolvable',
    });
  });

  it('reports a resolver fault as a backend failure, not a refusal', async () => {
    const flaky: Resolver = async () => {
      throw Object.assign(new Error('getaddrinfo EAI_AGAIN'), { code: 'EAI_AGAIN' });
    };
    expect(await guard('https://api.example.com/', { resolver: flaky })).toMatchObject({
      ok: false,
      code: 'tool_backend_failed',
      reason: 'dns_failed',
      details: { resolver_code: 'EAI_AGAIN' },
    });
  });

  it('lets an exception CIDR stand in for the internet, but only for the addresses it covers', async () => {
    const local = tableResolver({ 'api.example.test': ['127.0.0.1'], 'other.example.test': ['127.0.0.2'] });
    const allowCidrs = ['127.0.0.1/32'];
    expect(await guard('http://api.example.test/', { resolver: local, allowCidrs })).toMatchObject({ ok: true });
    expect(await guard('http://other.example.test/', { resolver: local, allowCidrs })).toMatchObject({
      reason: 'address_not_public',
    });
  });

  it('does not resolve a host the allowlist refuses', async () => {
    let asked = 0;
    const counting: Resolver = async () => {
      asked += 1;
      return [{ address: PUBLIC_V4, family: 4 }];
    };
    await guard('https://evil.test/', { resolver: counting, policy: { allowed_hosts: ['api.example.com'] } });
    expect(asked).toBe(0);
  });
});

describe('guard: the input becomes a request', () => {
  it('refuses inputs without a string url, and malformed headers', () => {
    expect(prepareRequest(undefined, anyHost)).toMatchObject({ reason: 'input_invalid' });
    expect(prepareRequest({ url: 42 }, anyHost)).toMatchObject({ reason: 'input_invalid', details: { field: 'url' } });
    expect(prepareRequest({ url: 'https://a.test/', headers: ['x'] }, anyHost)).toMatchObject({
      reason: 'input_invalid',
    });
    expect(prepareRequest({ url: 'https://a.test/', method: 7 }, anyHost)).toMatchObject({ reason: 'input_invalid' });
  });

  it('sends a string body as is and anything else as JSON', () => {
    const policy = { ...anyHost, methods: ['POST'] };
    expect(prepareRequest({ url: 'https://a.test/', method: 'post', body: 'raw' }, policy)).toMatchObject({
      ok: true,
      request: { method: 'POST', body: 'raw', headers: {} },
    });
    expect(prepareRequest({ url: 'https://a.test/', method: 'POST', body: { a: 1 } }, policy)).toMatchObject({
      ok: true,
      request: { body: '{"a":1}', headers: { 'content-type': 'application/json' } },
    });
  });

  it('refuses a body on GET and HEAD', () => {
    expect(prepareRequest({ url: 'https://a.test/', body: 'x' }, anyHost)).toMatchObject({
      reason: 'body_not_allowed',
    });
    expect(prepareRequest({ url: 'https://a.test/', method: 'HEAD', body: 'x' }, anyHost)).toMatchObject({
      reason: 'body_not_allowed',
    });
  });
});
