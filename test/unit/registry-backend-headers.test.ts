import { describe, expect, expectTypeOf, it } from 'vitest';
import type { CatalogPort } from '../../src/admission/ports.js';
import { loadConfig } from '../../src/config/config.js';
import { MissingSecretError, resolveBackendHeaders } from '../../src/registry/backend-headers.js';
import type { ToolCatalog } from '../../src/registry/tool-catalog.js';

describe('backend headers', () => {
  it('resolves literals as they are and secrets from the snapshot', () => {
    const headers = { authorization: { from_env: 'TOOLGATE_SECRET_API' }, 'x-client': 'toolgate' };
    expect(resolveBackendHeaders('t', { headers }, { TOOLGATE_SECRET_API: 'Bearer s3cret' })).toEqual({
      authorization: 'Bearer s3cret',
      'x-client': 'toolgate',
    });
    expect(resolveBackendHeaders('t', null, {})).toEqual({});
  });

  it('throws MissingSecretError naming the tool and variable when the secret is not set here', () => {
    expect(() =>
      resolveBackendHeaders('scf.lookup', { headers: { authorization: { from_env: 'TOOLGATE_SECRET_API' } } }, {}),
    ).toThrowError(MissingSecretError);
    expect(() =>
      resolveBackendHeaders('scf.lookup', { headers: { authorization: { from_env: 'TOOLGATE_SECRET_API' } } }, {}),
    ).toThrowError(/scf\.lookup.*TOOLGATE_SECRET_API/);
  });

  it('snapshots only TOOLGATE_SECRET_* variables into the configuration', () => {
    const config = loadConfig({
      TOOLGATE_SECRET_API: 'a',
      TOOLGATE_SECRET_: 'no name',
      DATABASE_URL: 'postgres://u:p@db/x',
      TOOLGATE_SECRETS_X: 'b',
      HOME: '/root',
    });
    expect(config.secrets).toEqual({ TOOLGATE_SECRET_API: 'a' });
    expect(Object.isFrozen(config.secrets)).toBe(true);
  });

  it('gives admission the catalog port it expects', () => {
    expectTypeOf<ToolCatalog>().toExtend<CatalogPort>();
  });
});
