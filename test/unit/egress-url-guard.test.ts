import { describe, expect, it } from 'vitest';
import type { EgressPolicy } from '../../src/egress/egress-policy.js';
import { checkUrl } from '../../src/egress/url-guard.js';

const anyHost: EgressPolicy = { allowed_hosts: ['*'], schemes: ['http', 'https'] };
const only = (...allowed_hosts: string[]): EgressPolicy => ({ allowed_hosts, schemes: ['http', 'https'] });

function reason(url: string, policy: EgressPolicy = anyHost, method = 'GET') {
  const verdict = checkUrl(url, method, policy);
  return verdict.ok ? 'ok' : verdict.reason;
}

function host(url: string, policy: EgressPolicy = anyHost) {
  const verdict = checkUrl(url, 'GET', policy);
  if (!verdict.ok) throw new Error(`refused: ${verdict.reason}`);
  return verdict.target.host;
}

describe('url guard: the URL must parse, and is never repaired', () => {
  it.each([
    // PayloadsAllTheThings, SSRF-Cloud-Instances.md "Encoding the IP to bypass WAF": overflowing forms.
    'http://425.510.425.510',
    'http://7147006462',
    'http://0x41414141A9FEA9FE',
    // PayloadsAllTheThings, README "Bypass Using an Encoded IP Address": octal spellings Node does not read.
    'http://o177.0.0.1/',
    'http://0o177.0.0.1/',
    'http://q177.0.0.1/',
    // ssrf-req-filter, test/fixtures/blockedUrls.js.
    'http://0000::1:80',
    'http://localhost:+11211aaa',
    'http://localhost:00011211aaaa',
    // Not a URL at all.
    'not a url',
    '/relative/path',
  ])('refuses %j as unparseable or ambiguous', (url) => {
    expect(['url_unparseable', 'url_ambiguous']).toContain(reason(url));
  });

  it.each([
    // Orange Tsai, "A New Era of SSRF" (Black Hat USA 2017), as collected in PayloadsAllTheThings
    // README "Bypass Abusing URL Parsing Discrepancy": parsers disagree on `\`, spaces and `#`.
    'http://127.1.1.1:80\\@127.2.2.2:80/',
    'http://127.1.1.1:80\\@@127.2.2.2:80/',
    'http://127.1.1.1:80:\\@@127.2.2.2:80/',
    'http://127.1.1.1:80#\\@127.2.2.2:80/',
    'http://1.1.1.1 &@2.2.2.2# @3.3.3.3/',
    // The brief's backslash form: WHATWG reads `\` as `/` (host evil.com), others as part of the user.
    'http://evil.com\\@allowed.com',
    // WHATWG URL Standard, basic URL parser: tabs and newlines are removed anywhere, leading and
    // trailing C0 controls and spaces are stripped. Each is a silent repair.
    'http://127.0.0.1\tfoo.example.com/',
    'http://exam\nple.com/',
    ' http://example.com/',
    'http://example.com/\u0000',
    // WHATWG special-scheme repair: `http:host` and `http:/host` become `http://host`.
    'http:example.com',
    'http:/example.com',
    // An empty authority: the parser skips the extra slashes and takes the path's first segment
    // as the host, where RFC 3986 reads an empty host and a path.
    'https:///example.com/',
    'https:////example.com/',
    'http:///127.0.0.1/',
  ])('refuses %j as ambiguous', (url) => {
    expect(reason(url)).toBe('url_ambiguous');
  });

  describe('against a base (a redirect Location)', () => {
    const base = new URL('https://api.example.com/v1/items');
    const relative = (url: string) => {
      const verdict = checkUrl(url, 'GET', anyHost, {}, base);
      return verdict.ok ? verdict.target.url.href : verdict.reason;
    };

    it.each(['///evil.com/', 'https:///evil.com/', 'http:/evil.com', 'http:evil.com'])(
      'refuses %j, which names a host it does not spell out',
      (url) => {
        expect(relative(url)).toBe('url_ambiguous');
      },
    );

    it('refuses an empty user part in a network-path reference', () => {
      expect(relative('//@evil.com/')).toBe('credentials_in_url');
    });

    it('resolves paths and network-path references as written', () => {
      expect(relative('/v2/items?page=2')).toBe('https://api.example.com/v2/items?page=2');
      expect(relative('next')).toBe('https://api.example.com/v1/next');
      expect(relative('//cdn.example.com/a')).toBe('https://cdn.example.com/a');
      expect(relative('http://cdn.example.com/a')).toBe('http://cdn.example.com/a');
    });
  });
});

describe('url guard: scheme and method', () => {
  it('allows only https by default', () => {
    expect(reason('http://api.example.com/', { allowed_hosts: ['*'] })).toBe('scheme_not_allowed');
    expect(reason('https://api.example.com/', { allowed_hosts: ['*'] })).toBe('ok');
  });

  it.each([
    // PayloadsAllTheThings README, "Exploitation via URL Scheme" and "Bypass Using JAR Scheme".
    'file:///etc/passwd',
    'dict://127.0.0.1:6379/INFO',
    'gopher://localhost:25/_MAIL%20FROM:<attacker@example.com>%0D%0A',
    'sftp://evil.com:11111/',
    'ldap://localhost:11211/%0astats%0aquit',
    'jar:http://127.0.0.1!/',
  ])('refuses %s even when a policy lists the scheme', (url) => {
    const scheme = url.slice(0, url.indexOf(':'));
    expect(reason(url, { allowed_hosts: ['*'], schemes: ['http', 'https', scheme] })).toBe('scheme_not_allowed');
  });

  it('allows only GET by default, compares methods case-insensitively, and never allows TRACE or CONNECT', () => {
    expect(reason('https://api.example.com/', anyHost, 'POST')).toBe('method_not_allowed');
    expect(reason('https://api.example.com/', { ...anyHost, methods: ['post'] }, 'Post')).toBe('ok');
    expect(reason('https://api.example.com/', { ...anyHost, methods: ['TRACE'] }, 'TRACE')).toBe('method_not_allowed');
    expect(reason('https://api.example.com/', { ...anyHost, methods: ['CONNECT'] }, 'CONNECT')).toBe(
      'method_not_allowed',
    );
  });
});

describe('url guard: credentials in the URL', () => {
  it.each([
    // The brief's `http://allowed.com@evil.com`: the "host" a naive check sees is a user name.
    'http://allowed.com@evil.com',
    // ssrf-req-filter, test/fixtures/blockedUrls.js (after Orange Tsai's talk).
    'http://127.1.1.1:80@127.2.2.2:80',
    'http://127.1.1.1:80@@127.2.2.2:80',
    'http://127.1.1.1:80:@@127.2.2.2:80',
    // Orange Tsai, "A New Era of SSRF": the user part swallowing a host and port.
    'http://foo@evil.com:80@google.com/',
    // An empty user part parses away to nothing, but was still written.
    'http://@evil.com/',
    'http://:@evil.com/',
  ])('refuses %s', (url) => {
    expect(reason(url)).toBe('credentials_in_url');
  });

  it('reads `#@` as the fragment it is: the host is the one before it', () => {
    // ssrf-req-filter, test/fixtures/blockedUrls.js: 'http://127.1.1.1:80#@127.2.2.2:80'.
    expect(host('http://127.1.1.1:80#@127.2.2.2:80')).toBe('127.1.1.1');
  });
});

describe('url guard: the host, as the parser sees it, must be on the allowlist', () => {
  it('normalises case, one trailing dot and IDNA before matching', () => {
    expect(host('https://API.Example.COM./v1', only('api.example.com'))).toBe('api.example.com');
    expect(host('https://BÜCHER.example/', only('bücher.example'))).toBe('xn--bcher-kva.example');
    expect(reason('https://example..com/')).toBe('host_invalid');
    expect(reason('https://*.example.com/')).toBe('host_invalid');
  });

  it('sends the normalised host, without the trailing dot or the fragment', () => {
    const verdict = checkUrl('https://API.example.com./a?b=1#frag', 'get', only('api.example.com'));
    expect(verdict.ok && verdict.target.url.href).toBe('https://api.example.com/a?b=1');
    expect(verdict.ok && verdict.target.method).toBe('GET');
  });

  it.each([
    // Full-width ideographic full stop U+3002: UTS #46 maps it to `.` in WHATWG host parsing, so
    // the guard matches the host the request will really go to.
    ['http://evil。com/', 'evil.com'],
    ['http://allowed.com。evil.com/', 'allowed.com.evil.com'],
    // PayloadsAllTheThings README, "Bypass Using Different Encoding": enclosed alphanumerics.
    ['http://ⓔⓧⓐⓜⓟⓛⓔ.ⓒⓞⓜ', 'example.com'],
    // PayloadsAllTheThings README, "Bypass Localhost with a Domain Redirect".
    ['http://company.127.0.0.1.nip.io/', 'company.127.0.0.1.nip.io'],
  ])('matches %s as %s', (url, parsed) => {
    expect(checkUrl(url, 'GET', only('allowed.com'))).toMatchObject({
      ok: false,
      reason: 'host_not_allowed',
      details: { host: parsed },
    });
  });

  it('matches exact hosts, and wildcards for subdomains only', () => {
    const policy = only('api.example.com', '*.un.org');
    expect(reason('https://api.example.com/', policy)).toBe('ok');
    expect(reason('https://www.api.example.com/', policy)).toBe('host_not_allowed');
    expect(reason('https://example.com/', policy)).toBe('host_not_allowed');
    expect(reason('https://data.un.org/', policy)).toBe('ok');
    expect(reason('https://a.b.un.org/', policy)).toBe('ok');
    expect(reason('https://un.org/', policy)).toBe('host_not_allowed');
    expect(reason('https://evilun.org/', policy)).toBe('host_not_allowed');
    expect(reason('https://un.org.evil.com/', policy)).toBe('host_not_allowed');
  });

  it('lets "*" cover any public name but not names that only exist inside a site', () => {
    expect(reason('https://api.example.com/')).toBe('ok');
    expect(reason('https://8.8.8.8/')).toBe('ok'); // its address is judged later, like any other
    for (const url of [
      'http://localhost/',
      'http://intranet/',
      'http://db.internal/',
      'http://printer.local/',
      'http://nas.home.arpa/',
      'http://app.localhost/',
    ]) {
      expect(reason(url)).toBe('host_not_allowed');
    }
  });

  it.each([
    // PayloadsAllTheThings, SSRF-Cloud-Instances.md: metadata names for GCP and AWS.
    'http://metadata.google.internal/computeMetadata/v1/',
    'http://metadata/computeMetadata/v1/',
    'http://instance-data/latest/meta-data/',
  ])('refuses the metadata name %s even when it is listed explicitly', (url) => {
    const listed = only(new URL(url).hostname);
    expect(checkUrl(url, 'GET', listed)).toMatchObject({
      ok: false,
      reason: 'host_not_allowed',
      details: { classification: 'cloud_metadata' },
    });
  });

  it('matches IP-literal entries in any spelling the parser accepts', () => {
    expect(reason('http://[0:0:0:0:0:0:0:1]/', only('[::1]'))).toBe('ok');
    expect(reason('http://2130706433/', only('127.0.0.1'))).toBe('ok');
    expect(reason('http://127.0.0.1/', only('*.0.0.1'))).toBe('host_not_allowed');
  });

  it('ignores policy entries that are not plain hosts, so a typo fails closed', () => {
    for (const entry of ['api.example.com:443', 'api.example.com/v1', 'user@api.example.com', '*.', '']) {
      expect(reason('https://api.example.com/', only(entry))).toBe('host_not_allowed');
    }
  });
});

describe("url guard: a grant's egress_domains narrows, never widens", () => {
  const policy = only('*.example.com');

  it('requires both the policy and the grant to match', () => {
    const narrowing = { egress_domains: ['api.example.com'] };
    expect(checkUrl('https://api.example.com/', 'GET', policy, narrowing).ok).toBe(true);
    expect(checkUrl('https://www.example.com/', 'GET', policy, narrowing)).toMatchObject({
      reason: 'host_not_in_grant',
    });
  });

  it('cannot add a host the policy does not allow', () => {
    const narrowing = { egress_domains: ['evil.test', '*'] };
    expect(checkUrl('https://evil.test/', 'GET', policy, narrowing)).toMatchObject({ reason: 'host_not_allowed' });
  });

  it('narrows to nothing when empty, and not at all when absent', () => {
    expect(checkUrl('https://api.example.com/', 'GET', policy, { egress_domains: [] })).toMatchObject({
      reason: 'host_not_in_grant',
    });
    expect(checkUrl('https://api.example.com/', 'GET', policy, {}).ok).toBe(true);
  });
});
