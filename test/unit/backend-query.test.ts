import { describe, expect, it } from 'vitest';
import { fixedQueryCollisions, queryParameterKey, urlWithInputQuery } from '../../src/proxy/backend-query.js';

describe('urlWithInputQuery: a GET call’s input as query parameters after the registered ones', () => {
  it('never lets an input key replace or repeat a parameter the registered URL fixes', () => {
    const { url, withheld } = urlWithInputQuery('https://api.example/x?api_key=SECRET&mode=safe', {
      mode: 'unsafe',
      api_key: 'mine',
      q: 'hi',
    });
    expect(url.href).toBe('https://api.example/x?api_key=SECRET&mode=safe&q=hi');
    expect(withheld).toEqual(['mode', 'api_key']);
  });

  it('keeps the registered query byte for byte, fragment included', () => {
    const { url } = urlWithInputQuery('https://api.example/x?sig=a%20b~&flag&t=1&t=2#frag', { q: 'a b' });
    expect(url.href).toBe('https://api.example/x?sig=a%20b~&flag&t=1&t=2&q=a+b#frag');
  });

  it('encodes non-string values as JSON text', () => {
    const { url } = urlWithInputQuery('https://api.example/x', { o: { a: [1] }, n: 1.5, b: false, z: null });
    expect([...url.searchParams]).toEqual([
      ['o', '{"a":[1]}'],
      ['n', '1.5'],
      ['b', 'false'],
      ['z', 'null'],
    ]);
  });

  it('leaves the URL as registered for no input, an empty object or a non-object', () => {
    for (const input of [undefined, null, {}, 'text', 3]) {
      expect(urlWithInputQuery('https://api.example/x?mode=safe', input).url.href).toBe(
        'https://api.example/x?mode=safe',
      );
    }
  });

  it('matches names as lenient backends read them', () => {
    expect(['MODE', 'mode[]', 'mode[a][b]', ' mode', 'Mode']).toSatisfy((names: string[]) =>
      names.every((n) => queryParameterKey(n) === 'mode'),
    );
    expect(['api.key', 'api key', 'API_KEY', 'api_key[0]'].map(queryParameterKey)).toEqual([
      'api_key',
      'api_key',
      'api_key',
      'api_key',
    ]);
    expect(queryParameterKey('modes')).toBe('modes');
    // A fixed name written with a suffix or an encoding is matched by its decoded, normalised form.
    expect(
      fixedQueryCollisions('https://api.example/x?ids%5B%5D=1&Api%2EKey=s', { ids: [2], api_key: 'x', other: 1 }),
    ).toEqual(['ids', 'api_key']);
    expect(fixedQueryCollisions('https://api.example/x', { mode: 'x' })).toEqual([]);
  });
});
