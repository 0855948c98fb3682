import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';

describe('kill-switch and grant-expiry configuration', () => {
  it('defaults to a 1 s version check, a 5 s staleness bound and a 1 s expiry sweep', () => {
    const config = loadConfig({});
    expect(config.killSwitches).toEqual({ pollIntervalMs: 1_000, maxStalenessMs: 5_000 });
    expect(config.grants).toEqual({ expirySweepIntervalMs: 1_000 });
  });

  it('refuses a version check that is not shorter than the staleness bound, naming the variable', () => {
    expect(() => loadConfig({ TOOLGATE_KILL_SWITCH_POLL_MS: '5000' })).toThrow(ConfigError);
    expect(() => loadConfig({ TOOLGATE_KILL_SWITCH_POLL_MS: '5000' })).toThrow(/TOOLGATE_KILL_SWITCH_POLL_MS/);
    expect(() => loadConfig({ TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS: 'soon' })).toThrow(
      /TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS/,
    );
    // The hard bound is 5 s (docs/design/replica-snapshots.md): a replica may not act on an older snapshot.
    expect(() => loadConfig({ TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS: '6000' })).toThrow(
      /TOOLGATE_KILL_SWITCH_MAX_STALENESS_MS/,
    );
    expect(() => loadConfig({ TOOLGATE_GRANT_EXPIRY_SWEEP_MS: '0' })).toThrow(/TOOLGATE_GRANT_EXPIRY_SWEEP_MS/);
  });
});
