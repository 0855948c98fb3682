import { describe, expect, it } from 'vitest';
import {
  exactVersionOf,
  newestFirst,
  pickVersion,
  type VersionCandidate,
} from '../../src/registry/version-resolution.js';

const v = (version: string, deprecated = false): VersionCandidate => ({ version, deprecated });
const picked = (candidates: VersionCandidate[], range?: string) => pickVersion(candidates, range)?.version;

describe('version resolution', () => {
  const versions = [v('1.0.0'), v('1.2.0'), v('1.10.0', true), v('2.0.0'), v('2.1.0-beta.1'), v('3.0.0', true)];

  it('gives the newest non-deprecated release when no range is asked for', () => {
    expect(picked(versions)).toBe('2.0.0');
  });

  it('compares by semver precedence, not as text', () => {
    expect(picked([v('1.9.0'), v('1.10.0')])).toBe('1.10.0');
    expect(newestFirst([v('1.9.0'), v('1.10.0'), v('1.10.0-rc.1')]).map((c) => c.version)).toEqual([
      '1.10.0',
      '1.10.0-rc.1',
      '1.9.0',
    ]);
  });

  it('gives the newest non-deprecated match of a range', () => {
    expect(picked(versions, '^1.0.0')).toBe('1.2.0');
    expect(picked(versions, '~1.0')).toBe('1.0.0');
    expect(picked(versions, '>=1.1.0 <2')).toBe('1.2.0');
    expect(picked(versions, '*')).toBe('2.0.0');
  });

  it('gives a deprecated version only when it is asked for exactly', () => {
    expect(picked(versions, '1.10.0')).toBe('1.10.0');
    expect(picked(versions, '=3.0.0')).toBe('3.0.0');
    expect(picked(versions, 'v1.10.0')).toBe('1.10.0');
    expect(picked(versions, '^3.0.0')).toBeUndefined();
    expect(picked(versions, '>=1.3.0 <2')).toBeUndefined();
  });

  it('reaches a pre-release only by a range that names it, or when no release is left', () => {
    expect(picked(versions, '^2.1.0-beta.0')).toBe('2.1.0-beta.1');
    expect(picked(versions, '^2.0.0')).toBe('2.0.0');
    expect(picked([v('0.1.0-alpha.1'), v('0.1.0-alpha.2')])).toBe('0.1.0-alpha.2');
  });

  it('finds nothing for an unknown exact version, an unparseable range or no usable version', () => {
    expect(picked(versions, '4.0.0')).toBeUndefined();
    expect(picked(versions, 'latest')).toBeUndefined();
    expect(picked([v('1.0.0', true)])).toBeUndefined();
    expect(picked([])).toBeUndefined();
  });

  it('recognises exact versions and nothing else as exact', () => {
    expect(exactVersionOf('1.2.3')).toBe('1.2.3');
    expect(exactVersionOf(' = 1.2.3 ')).toBe('1.2.3');
    expect(exactVersionOf('1.2')).toBeUndefined();
    expect(exactVersionOf('^1.2.3')).toBeUndefined();
  });
});
