import { describe, expect, it } from 'vitest';
import { checkRequestHeaders, filterResponseHeaders } from '../../src/egress/egress-headers.js';
import type { EgressPolicy } from '../../src/egress/egress-policy.js';

const policy: EgressPolicy = { allowed_hosts: ['*'] };

describe('request headers', () => {
  it('keeps ordinary headers, lower-cased', () => {
    expect(checkRequestHeaders({ Accept: 'application/json', 'X-Trace': 'abc' }, policy)).toEqual({
      ok: true,
      headers: { accept: 'application/json', 'x-trace': 'abc' },
    });
  });

  it('drops hop-by-hop and gateway-owned headers silently', () => {
    const headers = {
      Connection: 'close',
      'Keep-Alive': 'timeout=5',
      'Transfer-Encoding': 'chunked',
      TE: 'trailers',
      Upgrade: 'websocket',
      'Content-Length': '999',
      'Accept-Encoding': 'zstd',
      Expect: '100-continue',
      'x-kept': '1',
    };
    expect(checkRequestHeaders(headers, policy)).toEqual({ ok: true, headers: { 'x-kept': '1' } });
  });

  it('refuses a host override and proxy credentials', () => {
    expect(checkRequestHeaders({ Host: 'internal.corp' }, policy)).toMatchObject({
      reason: 'header_not_allowed',
      details: { header: 'host' },
    });
    expect(checkRequestHeaders({ 'Proxy-Authorization': 'Basic eDp5' }, policy)).toMatchObject({
      reason: 'header_not_allowed',
    });
  });

  it('refuses authorization and cookie unless the policy allows credential headers', () => {
    expect(checkRequestHeaders({ Authorization: 'Bearer t' }, policy)).toMatchObject({ reason: 'header_not_allowed' });
    expect(checkRequestHeaders({ Cookie: 'a=b' }, policy)).toMatchObject({ reason: 'header_not_allowed' });
    expect(checkRequestHeaders({ Authorization: 'Bearer t' }, { ...policy, allow_credential_headers: true })).toEqual({
      ok: true,
      headers: { authorization: 'Bearer t' },
    });
  });

  it('refuses CR/LF in values and malformed names (request splitting)', () => {
    expect(checkRequestHeaders({ 'x-a': 'v\r\nHost: internal' }, policy)).toMatchObject({ reason: 'input_invalid' });
    expect(checkRequestHeaders({ 'bad name': 'v' }, policy)).toMatchObject({ reason: 'input_invalid' });
    expect(checkRequestHeaders({ 'x-a': 1 as unknown as string }, policy)).toMatchObject({ reason: 'input_invalid' });
  });
});

describe('response headers', () => {
  it('strips cookies and hop-by-hop headers, and whatever Connection names', () => {
    const filtered = filterResponseHeaders(
      {
        'content-type': 'application/json',
        'set-cookie': ['a=1', 'b=2'],
        'set-cookie2': 'c=3',
        connection: 'keep-alive, x-internal-hop',
        'keep-alive': 'timeout=5',
        'transfer-encoding': 'chunked',
        'x-internal-hop': 'secret',
        'x-request-id': 'r1',
        'x-multi': ['a', 'b'],
      },
      false,
    );
    expect(filtered).toEqual({ 'content-type': 'application/json', 'x-request-id': 'r1', 'x-multi': 'a, b' });
  });

  it('drops content-encoding and content-length only when the body was decoded', () => {
    const headers = { 'content-encoding': 'gzip', 'content-length': '20' };
    expect(filterResponseHeaders(headers, true)).toEqual({});
    expect(filterResponseHeaders(headers, false)).toEqual(headers);
  });
});
