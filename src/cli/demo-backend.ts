import { createHash, randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

/**
 * `npm run demo:backend`: answers the quickstart's tool, an echo and examples/scf-catalog.json's
 * agent tools from made-up data. For trying toolgate out only.
 */

const usage = `usage: npm run demo:backend -- [--host 127.0.0.1] [--port 9000]
Answers POST /fact-check {"claim": "..."}, POST /echo, and POST /<tool id> for the agent tools of
examples/scf-catalog.json. Stop it with Ctrl-C.`;

type Input = Record<string, unknown>;
interface Answer {
  status?: number;
  body: unknown;
}
/** One tool: its input (the step's `input`) and the tenant the gateway names in x-toolgate-tenant-id. */
type Handler = (input: Input, call: { tenantId: string }) => Answer;

const CLAIMS: Record<string, 'supported' | 'refuted'> = {
  'the earth orbits the sun': 'supported',
  'water boils at 100 °c at sea level': 'supported',
  'the moon is made of cheese': 'refuted',
  'the great wall of china is visible from the moon with the naked eye': 'refuted',
};

const CONTROLS: Record<string, { title: string; description: string }> = {
  'GOV-01': {
    title: 'Cybersecurity & Data Protection Governance Program',
    description: 'Facilitate the implementation of cybersecurity and data protection governance controls.',
  },
  'IAC-01': {
    title: 'Identity & Access Management (IAM)',
    description: 'Facilitate the implementation of identification and access management controls.',
  },
  'CRY-01': {
    title: 'Use of Cryptographic Controls',
    description: 'Facilitate the implementation of cryptographic protections controls.',
  },
};

const FRAMEWORKS = [
  { framework_id: 'iso-27001-2022', name: 'ISO/IEC 27001:2022' },
  { framework_id: 'nist-csf-2.0', name: 'NIST Cybersecurity Framework 2.0' },
];

const notFound = (what: string): Answer => ({ status: 404, body: { error: `${what} not found in the demo data` } });
const control = (id: unknown): Answer => {
  const found = typeof id === 'string' ? CONTROLS[id] : undefined;
  return found ? { body: { control_id: id, code: id, ...found } } : notFound(`control ${String(id)}`);
};
const empty: Handler = () => ({ body: { items: [] } });
const draft: Handler = () => ({ body: { draft_id: `draft-${randomUUID()}`, status: 'draft' } });

const HANDLERS: Record<string, Handler> = {
  'fact-check': (input) => {
    const claim = typeof input.claim === 'string' ? input.claim : '';
    const verdict = CLAIMS[claim.trim().toLowerCase().replace(/\.$/, '')] ?? 'unverified';
    return { body: { claim, verdict, checked_against: 'the demo backend’s list of four claims' } };
  },
  echo: (input) => ({ body: { echo: input } }),
  get_scf_version: () => ({ body: { version: '2025.2', active: true } }),
  list_scf_frameworks: () => ({ body: { frameworks: FRAMEWORKS } }),
  get_scf_framework_requirements: (input) =>
    FRAMEWORKS.some((f) => f.framework_id === input.framework_id)
      ? {
          body: {
            framework_id: input.framework_id,
            requirements: [{ requirement_id: 'demo-1', title: 'A requirement of the demo data' }],
          },
        }
      : notFound(`framework ${String(input.framework_id)}`),
  get_scf_control: (input) => control(input.control_id),
  get_scf_control_by_code: (input) => control(input.code),
  get_official_scf_mappings: (input) => {
    const known =
      typeof input.control_id === 'string' &&
      input.control_id in CONTROLS &&
      FRAMEWORKS.some((f) => f.framework_id === input.framework_id);
    return {
      body: {
        mappings: known ? [{ framework_id: input.framework_id, requirement_id: 'demo-1', official: true }] : [],
        mapping_absence: !known,
      },
    };
  },
  // The demo holds no assessment documents: searches find nothing, and any chunk is a placeholder.
  search_assessment_kb: empty,
  get_evidence_candidates: empty,
  list_document_metadata: empty,
  get_chunk_context: (input, call) => {
    const text = 'A placeholder chunk: the demo backend holds no documents.';
    const chunk = {
      source: 'demo',
      document_id: 'doc-demo',
      chunk_id: String(input.chunk_id),
      tenant_id: call.tenantId || 'demo',
    };
    const sha256 = createHash('sha256').update(text).digest('hex');
    return { body: { ...chunk, chunk_sha256: sha256, organization_id: 'org-demo', assessment_id: 'asm-demo', text } };
  },
  get_approved_soa: empty,
  list_soa_items: empty,
  get_approved_gap_analysis: empty,
  list_gap_findings: empty,
  get_maturity_context: empty,
  get_poam_context: empty,
  get_report_sources: empty,
  suggest_soa_item_update_draft: draft,
  suggest_gap_finding_draft: draft,
  suggest_maturity_score_draft: draft,
  suggest_poam_item_draft: draft,
  suggest_report_section_draft: draft,
};

/** The paths the demo backend answers, without the leading slash. */
export const DEMO_TOOL_PATHS = Object.keys(HANDLERS);

async function readJson(request: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  const text = Buffer.concat(chunks).toString('utf8');
  return text === '' ? {} : JSON.parse(text);
}

/** Starts the demo backend; `port` 0 picks a free one. Logs one line per call unless `quiet`. */
export async function startDemoBackend(options: {
  host: string;
  port: number;
  quiet?: boolean;
}): Promise<{ server: Server; url: string }> {
  const server = createServer((request, response) => {
    const send = (status: number, body: unknown) => {
      response.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
      if (!options.quiet) {
        const header = (name: string) => request.headers[`x-toolgate-${name}`] ?? '-';
        process.stdout.write(
          `${request.method} ${request.url} → ${status}  run=${header('run-id')} tenant=${header('tenant-id')} agent=${header('agent-id')}\n`,
        );
      }
    };
    const handler = HANDLERS[(request.url ?? '').split('?')[0]!.slice(1)];
    if (request.method !== 'POST' || !handler) {
      send(404, { error: `no demo tool at ${request.method} ${request.url}` });
      return;
    }
    readJson(request).then(
      (input) => {
        const tenantId = String(request.headers['x-toolgate-tenant-id'] ?? '');
        const answer = handler(input !== null && typeof input === 'object' ? (input as Input) : {}, { tenantId });
        send(answer.status ?? 200, answer.body);
      },
      () => send(400, { error: 'the body is not JSON' }),
    );
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, options.host, () => resolve());
  });
  const { port } = server.address() as AddressInfo;
  const host = options.host.includes(':') ? `[${options.host}]` : options.host;
  return { server, url: `http://${host}:${port}` };
}

async function main(): Promise<void> {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '9000' },
        help: { type: 'boolean' },
      },
      strict: true,
    }));
  } catch (error) {
    process.stderr.write(`demo:backend: ${(error as Error).message}\n${usage}\n`);
    process.exit(2);
  }
  if (values.help) {
    process.stdout.write(`${usage}\n`);
    return;
  }
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    process.stderr.write(`demo:backend: --port must be a port number\n${usage}\n`);
    process.exit(2);
  }
  const { server, url } = await startDemoBackend({ host: values.host, port });
  process.stdout.write(`demo backend listening on ${url} (POST /fact-check, /echo, /<SCF tool id>); Ctrl-C stops it\n`);
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      server.close(() => process.exit(0));
      server.closeAllConnections();
    });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((error: unknown) => {
    process.stderr.write(`demo:backend: ${error instanceof Error ? error.message : String(error)}\n`);
    process.exit(1);
  });
}
