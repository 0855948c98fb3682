import { readFile } from 'node:fs/promises';

/** An example catalog file (`examples/*.json`): the tools to register, in dependency order, plus documentation fields. */
export interface CatalogFile {
  description?: string;
  agents?: Array<{ id: string; name: string; may_use: string[] }>;
  forbidden_tools?: Array<{ id: string; category: string; reason: string }>;
  tools: Array<Record<string, unknown> & { id: string; version: string; category: string; backend?: unknown }>;
}

/** Sends one registration (through an in-process client). */
export type RegisterTool = (body: Record<string, unknown>) => Promise<{ status: number; body: unknown }>;

export interface SeedOutcome {
  id: string;
  version: string;
  /** `registered` (201), `unchanged` (200, the same content was already there) or `failed`. */
  result: 'registered' | 'unchanged' | 'failed';
  status: number;
  error?: unknown;
}

export async function readCatalogFile(path: string): Promise<CatalogFile> {
  const parsed = JSON.parse(await readFile(path, 'utf8')) as CatalogFile;
  if (!Array.isArray(parsed.tools)) throw new Error(`${path}: no "tools" array`);
  return parsed;
}

/**
 * Registers every tool of a catalog through the API, in file order (dependencies first). Seeding
 * twice is harmless: identical versions answer `unchanged`. With `backendBase`, tools that have
 * no backend (and are not `external_call`) get `<backendBase>/<tool id>`.
 */
export async function seedCatalog(
  catalog: CatalogFile,
  register: RegisterTool,
  options: { backendBase?: string } = {},
): Promise<SeedOutcome[]> {
  const outcomes: SeedOutcome[] = [];
  for (const tool of catalog.tools) {
    const body = { ...tool };
    if (
      options.backendBase &&
      (body.backend === null || body.backend === undefined) &&
      body.category !== 'external_call'
    ) {
      body.backend = {
        url: `${options.backendBase.replace(/\/+$/, '')}/${tool.id}`,
        method: 'POST',
        timeout_ms: 10_000,
        max_response_bytes: 1024 * 1024,
        headers: {},
      };
    }
    const response = await register(body);
    const result = response.status === 201 ? 'registered' : response.status === 200 ? 'unchanged' : 'failed';
    outcomes.push({
      id: tool.id,
      version: tool.version,
      result,
      status: response.status,
      ...(result === 'failed'
        ? { error: (response.body as { error?: unknown } | undefined)?.error ?? response.body }
        : {}),
    });
  }
  return outcomes;
}
