/**
 * The layering of src/ (docs: STYLE.md, "Where toolgate stands beside them"): no import cycle
 * between folders, and the domain rooms never reach into the HTTP layer. Type-only imports
 * count: a type pointing the wrong way is still the wrong way round.
 */
const DOORS = '^src/(http|mcp|cli|client)/|^src/(app|server|services)\\.ts$';

module.exports = {
  forbidden: [
    {
      name: 'no-folder-cycles',
      comment: 'Rooms depend downwards only: a cycle between folders of src/ means a piece points the wrong way.',
      severity: 'error',
      scope: 'folder',
      from: { path: '^src/' },
      to: { circular: true },
    },
    {
      name: 'domain-never-imports-http',
      comment: 'Domain rooms return decisions and throw CodedError; only the doors speak HTTP.',
      severity: 'error',
      from: { path: '^src/', pathNot: DOORS },
      to: { path: '^src/http/' },
    },
    {
      name: 'no-module-cycles',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
  ],
  options: {
    includeOnly: '^src/',
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
