import { describe, expect, it } from 'vitest';
import { surfaceDeprecations } from '../../src/registry/deprecation-report.js';
import { parseIsoDuration, reviewWindow, shiftBy } from '../../src/registry/review-window.js';
import type { ToolContract } from '../../src/registry/tool-contract.js';

const now = new Date('2026-03-15T12:00:00.000Z');

function tool(id: string, version: string, extra: Partial<ToolContract> = {}): ToolContract {
  return {
    id,
    version,
    display_name: id,
    description: id,
    category: 'read_only',
    risk_level: 'low',
    input_schema: true,
    output_schema: true,
    allowed_agents: [],
    required_context: [],
    required_scopes: [],
    requires_approval: false,
    side_effects: [],
    reads_from: [],
    writes_to: [],
    dependencies: [],
    deprecation: null,
    backend: null,
    target: { family: null, provider: null, region: null },
    cost_units: 1,
    rate_limit: null,
    egress: null,
    registered_at: '2026-01-01T00:00:00.000Z',
    registered_by: 'operator:test',
    ...extra,
  };
}

const deprecated = (at: string, replacement: string | null = null) => ({
  deprecation: { deprecated_at: at, replacement_tool_id: replacement },
});

describe('ISO 8601 review windows', () => {
  it('parses the forms operators write', () => {
    expect(parseIsoDuration('P30D')).toMatchObject({ days: 30, months: 0 });
    expect(parseIsoDuration('PT12H')).toMatchObject({ hours: 12 });
    expect(parseIsoDuration('P1Y2M3W4DT5H6M7.5S')).toEqual({
      years: 1,
      months: 2,
      weeks: 3,
      days: 4,
      hours: 5,
      minutes: 6,
      seconds: 7.5,
    });
  });

  it.each(['', 'P', 'PT', 'P1DT', '30D', '-P1D', 'P1.5D', 'P1H', 'PT1D'])('refuses %j', (text) => {
    expect(parseIsoDuration(text)).toBeUndefined();
  });

  it('moves by calendar months and years, not fixed lengths', () => {
    expect(shiftBy(new Date('2026-03-31T00:00:00Z'), parseIsoDuration('P1M')!, -1).toISOString()).toBe(
      '2026-03-03T00:00:00.000Z',
    );
    expect(shiftBy(new Date('2026-01-15T00:00:00Z'), parseIsoDuration('P1M')!, 1).toISOString()).toBe(
      '2026-02-15T00:00:00.000Z',
    );
    expect(reviewWindow(now, parseIsoDuration('P1W')!)).toEqual({
      from: new Date('2026-03-08T12:00:00.000Z'),
      to: new Date('2026-03-22T12:00:00.000Z'),
    });
  });
});

describe('the deprecation review', () => {
  const window = reviewWindow(now, parseIsoDuration('P7D')!);

  it('lists recent and scheduled deprecations inside the window, oldest first, and nothing outside it', () => {
    const tools = [
      tool('a', '1.0.0', deprecated('2026-03-10T00:00:00.000Z', 'b')),
      tool('a', '2.0.0', deprecated('2026-03-20T00:00:00.000Z')),
      tool('old', '1.0.0', deprecated('2026-01-01T00:00:00.000Z')),
      tool('later', '1.0.0', deprecated('2026-06-01T00:00:00.000Z')),
      tool('b', '1.0.0'),
    ];
    const notices = surfaceDeprecations(tools, window, now);
    expect(notices.map((n) => [n.tool_id, n.version, n.in_effect, n.replacement_tool_id])).toEqual([
      ['a', '1.0.0', true, 'b'],
      ['a', '2.0.0', false, null],
    ]);
  });

  it('names the live versions whose ranges still cover a deprecated version, and what they resolve to now', () => {
    const tools = [
      tool('lib', '1.0.0', deprecated('2026-03-14T00:00:00.000Z')),
      tool('lib', '1.1.0', deprecated('2026-03-14T00:00:00.000Z')),
      tool('lib', '1.2.0'),
      tool('wide', '1.0.0', { dependencies: [{ tool_id: 'lib', range: '^1.0.0' }] }),
      tool('pinned', '1.0.0', { dependencies: [{ tool_id: 'lib', range: '~1.1.0' }] }),
      tool('elsewhere', '1.0.0', { dependencies: [{ tool_id: 'lib', range: '^2.0.0' }] }),
      tool('retired', '1.0.0', {
        dependencies: [{ tool_id: 'lib', range: '^1.0.0' }],
        ...deprecated('2026-02-01T00:00:00.000Z'),
      }),
    ];
    const notice = surfaceDeprecations(tools, window, now).find((n) => n.version === '1.1.0')!;
    expect(notice.dependents).toEqual([
      { tool_id: 'wide', version: '1.0.0', range: '^1.0.0', resolves_to: '1.2.0' },
      { tool_id: 'pinned', version: '1.0.0', range: '~1.1.0', resolves_to: null },
    ]);
  });
});
