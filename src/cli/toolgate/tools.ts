import { readdir, readFile, stat } from 'node:fs/promises';
import { extname, join } from 'node:path';
import { Option } from 'commander';
import { parse } from 'yaml';
import type { Schemas } from '../../client/index.js';
import { record, table } from './format.js';
import { command, listOptions, type ListOptions } from './help.js';
import { CheckFailed, Session, UsageError } from './session.js';

const CONTRACT_FILES = new Set(['.json', '.yaml', '.yml']);
type Contract = Schemas['ToolRegistration'];

interface Registration {
  file: string;
  id: string;
  version: string;
  /** `registered` (201), `unchanged` (200: this exact content was there) or `failed`. */
  result: 'registered' | 'unchanged' | 'failed';
  status: number;
  error?: unknown;
}

export function toolsCommand() {
  const tools = command('tools', 'the tool registry', 'toolgate tools list', 'toolgate tools register ./contracts');

  tools.addCommand(
    listOptions(
      command(
        'list',
        'the catalog (operators), or the tools the caller may use (agents)',
        'toolgate tools list --category read_only',
      ),
      500,
    )
      .addOption(
        new Option('--category <category>').choices([
          'read_only',
          'draft_write',
          'external_call',
          'final_write',
          'admin',
        ]),
      )
      .action(async (options: ListOptions & { category?: Schemas['ToolCategory'] }, cmd) => {
        const s = new Session(cmd);
        const page = await s.page<Schemas['Tool'] | Schemas['AgentTool']>(
          options.all,
          (cursor) =>
            s.call(
              s.api.GET('/tools', { params: { query: { category: options.category, limit: options.limit, cursor } } }),
            ),
          options.cursor,
        );
        s.print(page, () =>
          table(
            ['ID', 'VERSION', 'CATEGORY', 'RISK', 'APPROVAL', 'DEPRECATED_AT'],
            page.items.map((t) => [
              t.id,
              t.version,
              t.category,
              t.risk_level,
              t.requires_approval ? 'required' : '-',
              t.deprecation?.deprecated_at,
            ]),
          ),
        );
        s.more(page.next_cursor);
      }),
  );

  tools.addCommand(
    command(
      'show',
      'one tool version (default: the newest non-deprecated)',
      'toolgate tools show web.fetch --version "^1.2"',
    )
      .argument('<id>')
      .option('--version <range>', 'a semver range or an exact version')
      .action(async (id: string, options: { version?: string }, cmd) => {
        const s = new Session(cmd);
        const tool = await s.call(
          s.api.GET('/tools/{id}', { params: { path: { id }, query: { version: options.version } } }),
        );
        s.print(tool, () => record(tool as Record<string, unknown>));
      }),
  );

  tools.addCommand(
    command('versions', 'every version of a tool, newest first', 'toolgate tools versions web.fetch')
      .argument('<id>')
      .action(async (id: string, _options, cmd) => {
        const s = new Session(cmd);
        const page = await s.call(s.api.GET('/tools/{id}/versions', { params: { path: { id } } }));
        s.print(page, () =>
          table(
            ['ID', 'VERSION', 'CATEGORY', 'REGISTERED_AT', 'DEPRECATED_AT'],
            page.items.map((t) => [t.id, t.version, t.category, t.registered_at, t.deprecation?.deprecated_at]),
          ),
        );
      }),
  );

  tools.addCommand(
    command(
      'deprecate',
      'deprecate a version, now or at a date',
      'toolgate tools deprecate web.fetch 1.0.0 --replacement web.fetch2',
    )
      .argument('<id>')
      .argument('<version>', 'an exact registered version')
      .option('--at <time>', 'RFC 3339 (default: now)')
      .option('--replacement <tool-id>', 'the tool to use instead')
      .action(async (id: string, version: string, options: { at?: string; replacement?: string }, cmd) => {
        const s = new Session(cmd);
        const body = {
          ...(options.at ? { deprecated_at: options.at } : {}),
          ...(options.replacement ? { replacement_tool_id: options.replacement } : {}),
        };
        const tool = await s.call(
          s.api.POST('/tools/{id}/versions/{version}/deprecate', { params: { path: { id, version } }, body }),
        );
        s.print(tool, () => `deprecated ${tool.id}@${tool.version} from ${tool.deprecation?.deprecated_at}`);
      }),
  );

  tools.addCommand(
    command(
      'register',
      'register every contract in the files and folders given (JSON or YAML); again changes nothing',
      'toolgate tools register ./contracts',
      'toolgate tools register examples/scf-catalog.json --backend-base http://127.0.0.1:9000',
    )
      .argument('<paths...>', 'contract files, or folders of them (*.json, *.yaml, *.yml)')
      .option('--backend-base <url>', 'give contracts without a backend (external calls aside) <url>/<tool id>')
      .action(async (paths: string[], options: { backendBase?: string }, cmd) => {
        const s = new Session(cmd);
        const contracts = await readContracts(paths);
        if (options.backendBase)
          for (const entry of contracts) entry.contract = withBackend(entry.contract, options.backendBase);
        const results = await registerAll(s, contracts);
        s.print({ items: results }, () =>
          table(
            ['RESULT', 'ID', 'VERSION', 'FILE', 'ERROR'],
            results.map((r) => [
              r.result,
              r.id,
              r.version,
              r.file,
              r.error
                ? `${(r.error as { code?: string }).code}: ${(r.error as { message?: string }).message}`
                : undefined,
            ]),
          ),
        );
        const failed = results.filter((r) => r.result === 'failed');
        if (failed.length > 0) throw new CheckFailed(`${failed.length} of ${results.length} contracts were refused`);
      }),
  );
  return tools;
}

/** Each file holds one contract, a list of them, or a catalog (`{tools: [...]}`); folders in name order. */
async function readContracts(paths: string[]): Promise<Array<{ file: string; contract: Contract }>> {
  const files: string[] = [];
  for (const path of paths) {
    const info = await stat(path).catch(() => undefined);
    if (!info) throw new UsageError(`${path}: no such file or folder`);
    if (info.isDirectory()) {
      const names = (await readdir(path)).filter((name) => CONTRACT_FILES.has(extname(name).toLowerCase())).sort();
      files.push(...names.map((name) => join(path, name)));
    } else files.push(path);
  }
  const contracts: Array<{ file: string; contract: Contract }> = [];
  for (const file of files) {
    let parsed: unknown;
    try {
      parsed = parse(await readFile(file, 'utf8'));
    } catch (error) {
      throw new UsageError(`${file}: ${(error as Error).message.split('\n')[0]}`);
    }
    const list = Array.isArray(parsed)
      ? parsed
      : Array.isArray((parsed as { tools?: unknown })?.tools)
        ? (parsed as { tools: unknown[] }).tools
        : [parsed];
    for (const contract of list) {
      if (typeof contract !== 'object' || contract === null) throw new UsageError(`${file}: a contract is an object`);
      contracts.push({ file, contract: contract as Contract });
    }
  }
  if (contracts.length === 0) throw new UsageError(`no contract in ${paths.join(', ')}`);
  return contracts;
}

/** A demo backend for a contract that has none: `<base>/<tool id>`, as `npm run demo:backend` answers. */
function withBackend(contract: Contract, base: string): Contract {
  if ((contract.backend !== null && contract.backend !== undefined) || contract.category === 'external_call')
    return contract;
  return {
    ...contract,
    backend: {
      url: `${base.replace(/\/+$/, '')}/${contract.id}`,
      method: 'POST',
      timeout_ms: 10_000,
      max_response_bytes: 1024 * 1024,
      headers: {},
    },
  };
}

/**
 * Registers the contracts in order; one refused for a dependency not registered yet is tried
 * again after the others, so that a folder need not be in dependency order.
 */
async function registerAll(
  s: Session,
  contracts: Array<{ file: string; contract: Contract }>,
): Promise<Registration[]> {
  const done = new Map<number, Registration>();
  let pending = contracts.map((_, index) => index);
  for (;;) {
    const waiting: number[] = [];
    for (const index of pending) {
      const { file, contract } = contracts[index]!;
      const { data, error, response } = await s.api.POST('/tools', { body: contract });
      const base = { file, id: String(contract.id), version: String(contract.version), status: response.status };
      if (response.ok) {
        done.set(index, {
          ...base,
          result: response.status === 201 ? 'registered' : 'unchanged',
          id: data!.id,
          version: data!.version,
        });
        continue;
      }
      const refused = (error as { error?: { code: string; message: string; details?: { reason?: string } } }).error;
      if (['unknown_tool', 'semver_range_no_match'].includes(refused?.details?.reason ?? '')) waiting.push(index);
      done.set(index, { ...base, result: 'failed', error: refused ?? error });
    }
    if (waiting.length === 0 || waiting.length === pending.length) break;
    pending = waiting;
  }
  return contracts.map((_, index) => done.get(index)!);
}
