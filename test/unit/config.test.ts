import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.js';

describe('configuration', () => {
  it('defaults to loopback:8080 on the embedded database', () => {
    const config = loadConfig({});
    expect(config).toMatchObject({
      port: 8080,
      host: '127.0.0.1',
      databaseUrl: undefined,
      dataDir: './data',
      maxPlanSteps: 32,
    });
  });

  it.each([
    ['PORT', 'eighty'],
    ['PORT', '70000'],
    ['DATABASE_URL', 'mysql://localhost/x'],
    ['LOG_LEVEL', 'chatty'],
    ['TOOLGATE_JWT_SECRET', 'short'],
    ['TOOLGATE_JWT_PUBLIC_KEY', 'not a pem'],
    ['TOOLGATE_EGRESS_ALLOW_CIDRS', '10.0.0.0/8,nonsense'],
    ['TOOLGATE_EGRESS_ALLOW_CIDRS', '999.1.1.1/8'],
    ['MAX_PLAN_STEPS', '0'],
    // Shorter than twice the longest backend timeout: a call in flight could lose its reservation.
    ['TOOLGATE_BUDGET_RESERVATION_TTL_SECONDS', '60'],
    // Shorter than a month: a budget created mid-month would miss reservations deleted with their runs.
    ['TOOLGATE_RETENTION_DAYS', '30'],
    ['TOOLGATE_RETENTION_SWEEP_MS', '10'],
  ])('refuses %s=%s, naming the variable', (name, value) => {
    expect(() => loadConfig({ [name]: value })).toThrowError(ConfigError);
    expect(() => loadConfig({ [name]: value })).toThrowError(new RegExp(name));
  });

  it('refuses two kinds of JWT key at once', () => {
    expect(() =>
      loadConfig({ TOOLGATE_JWT_SECRET: 'x'.repeat(40), TOOLGATE_JWT_JWKS_FILE: '/tmp/jwks.json' }),
    ).toThrowError(/only one of/);
  });

  it('refuses to run in production without a verification key', () => {
    expect(() => loadConfig({ NODE_ENV: 'production' })).toThrowError(/TOOLGATE_JWT_PUBLIC_KEY/);
  });

  it("refuses to run in production without a key to sign the audit log's checkpoints", () => {
    expect(() => loadConfig({ NODE_ENV: 'production', TOOLGATE_JWT_SECRET: 'x'.repeat(40) })).toThrowError(
      /TOOLGATE_AUDIT_SIGNING_KEY/,
    );
  });

  it('reads the log origin and the sequencing interval, within bounds', () => {
    expect(loadConfig({}).auditLog).toEqual({ origin: 'toolgate.local/audit', sequenceIntervalMs: 200 });
    expect(loadConfig({ TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '50' }).auditLog.sequenceIntervalMs).toBe(50);
    expect(() => loadConfig({ TOOLGATE_AUDIT_SEQUENCE_INTERVAL_MS: '2000' })).toThrowError(/50 to 1000/);
    expect(() => loadConfig({ TOOLGATE_AUDIT_LOG_ORIGIN: 'has space/audit' })).toThrowError(
      /TOOLGATE_AUDIT_LOG_ORIGIN/,
    );
  });

  it('keeps finished runs 90 days by default, swept every 10 minutes', () => {
    expect(loadConfig({}).retention).toEqual({ days: 90, sweepIntervalMs: 600_000 });
    expect(loadConfig({ TOOLGATE_RETENTION_DAYS: '400' }).retention.days).toBe(400);
  });

  it('parses exception CIDRs as a list', () => {
    expect(loadConfig({ TOOLGATE_EGRESS_ALLOW_CIDRS: ' 10.1.0.0/16, fd00::/8 ' }).egressAllowCidrs).toEqual([
      '10.1.0.0/16',
      'fd00::/8',
    ]);
  });
});
