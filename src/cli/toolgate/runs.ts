import { randomUUID } from 'node:crypto';
import { Option } from 'commander';
import type { Schemas } from '../../client/index.js';
import { identifier, toolId, versionRange } from '../../validation/fields.js';
import { cell, collectPair, parseField, parseJson, parseNumber, record, table } from './format.js';
import { command, listOptions, type ListOptions } from './help.js';
import { Session } from './session.js';

type Run = Schemas['Run'];
type Envelope = Schemas['RunEnvelope'];

function runRows(runs: Run[]): string {
  return table(
    ['RUN', 'TENANT', 'AGENT', 'STATUS', 'STEPS', 'PARENT', 'UPDATED_AT'],
    runs.map((r) => [r.run_id, r.tenant_id, r.agent_id, r.status, r.steps.length, r.parent_run_id, r.updated_at]),
  );
}

function stepRows(steps: Envelope['steps']): string {
  const rows = table(
    ['STEP', 'TOOL', 'VERSION', 'STATUS', 'CODE', 'COST', 'OUTPUT'],
    steps.map((step) => [
      step.index,
      step.tool_id,
      step.version,
      step.status,
      step.error?.code,
      step.cost_units,
      step.output,
    ]),
  );
  const waiting = steps
    .filter((step) => step.approval_id)
    .map(
      (step) =>
        `\nstep ${step.index} waits for approval ${step.approval_id} (toolgate approvals approve ${step.approval_id} --reason …)`,
    );
  return rows + waiting.join('');
}

function envelopeText(envelope: Envelope): string {
  const warnings = envelope.warnings.length ? `\nwarnings: ${envelope.warnings.map(cell).join(', ')}` : '';
  return `run ${envelope.run_id}: ${envelope.status}${envelope.dry_run ? ' (dry run)' : ''}\n\n${stepRows(envelope.steps)}${warnings}`;
}

export function runsCommand() {
  const runs = command(
    'runs',
    'runs: plans of tool calls, and their controls',
    'toolgate runs list --status awaiting_approval',
  );

  runs.addCommand(
    listOptions(command('list', 'runs, newest first', 'toolgate runs list --agent a1 --status running'), 200)
      .option('--tenant <id>')
      .option('--agent <id>')
      .addOption(
        new Option('--status <status>').choices([
          'queued',
          'running',
          'paused',
          'awaiting_approval',
          'throttled',
          'completed',
          'failed',
          'cancelled',
          'killed',
        ]),
      )
      .action(async (options: ListOptions & { tenant?: string; agent?: string; status?: Run['status'] }, cmd) => {
        const s = new Session(cmd);
        const page = await s.page(
          options.all,
          (cursor) =>
            s.call(
              s.api.GET('/runs', {
                params: {
                  query: {
                    tenant_id: options.tenant,
                    agent_id: options.agent,
                    status: options.status,
                    limit: options.limit,
                    cursor,
                  },
                },
              }),
            ),
          options.cursor,
        );
        s.print(page, () => runRows(page.items));
        s.more(page.next_cursor);
      }),
  );

  runs.addCommand(
    command('show', 'one run, with its steps', 'toolgate runs show run-2026-12-03-1')
      .argument('<run-id>')
      .option('--tenant <id>', "platform-operators: the run's tenant")
      .action(async (runId: string, options: { tenant?: string }, cmd) => {
        const s = new Session(cmd);
        const run = await s.call(
          s.api.GET('/runs/{run_id}', { params: { path: { run_id: runId }, query: { tenant_id: options.tenant } } }),
        );
        const { steps, ...about } = run;
        s.print(run, () => `${record(about)}\n\n${stepRows(steps)}`);
      }),
  );

  for (const [verb, path, what] of [
    ['cancel', '/runs/{run_id}/cancel', 'cancel a run and its open sub-runs'],
    ['kill', '/runs/{run_id}/kill', 'kill a run and its sub-runs (operators)'],
    ['pause', '/runs/{run_id}/pause', 'pause a run before its next call (operators)'],
  ] as const) {
    runs.addCommand(
      command(verb, what, `toolgate runs ${verb} run-2026-12-03-1 --reason "incident 7"`)
        .argument('<run-id>')
        .option('--reason <text>')
        .option('--tenant <id>', "platform-operators: the run's tenant")
        .action(async (runId: string, options: { reason?: string; tenant?: string }, cmd) => {
          const s = new Session(cmd);
          const run = await s.call(
            s.api.POST(path, {
              params: { path: { run_id: runId }, query: { tenant_id: options.tenant } },
              body: options.reason ? { reason: options.reason } : {},
            }),
          );
          s.print(run, () => `run ${run.run_id}: ${run.status}`);
        }),
    );
  }

  runs.addCommand(
    command(
      'resume',
      'resume a paused, approved or throttled run; every check runs again (exit 1 unless it went on)',
      'toolgate runs resume run-2026-12-03-1',
    )
      .argument('<run-id>')
      .option('--reason <text>')
      .option('--tenant <id>', "platform-operators: the run's tenant")
      .action(async (runId: string, options: { reason?: string; tenant?: string }, cmd) => {
        const s = new Session(cmd);
        const answer = await s.answer(
          s.api.POST('/runs/{run_id}/resume', {
            params: { path: { run_id: runId }, query: { tenant_id: options.tenant } },
            body: options.reason ? { reason: options.reason } : {},
          }),
        );
        printEnvelope(s, answer);
      }),
  );

  runs.addCommand(
    command(
      'execute',
      'call one tool as an agent (agent token), through every admission stage (exit 1 when a step is refused)',
      `toolgate runs execute --tool web.fetch --input '{"url":"https://example.com"}' --context organization_id=o1`,
    )
      .addOption(new Option('--tool <id>').argParser(parseField(toolId)).makeOptionMandatory())
      .option('--version <range>', 'a semver range (default: the newest non-deprecated)', parseField(versionRange))
      .addOption(new Option('--input <json>', 'the tool input').argParser(parseJson).makeOptionMandatory())
      .option('--run-id <id>', 'default: a new run id', parseField(identifier))
      .addOption(
        new Option('--context <key=value>', 'a context key the tool requires (repeatable)').argParser(collectPair),
      )
      .addOption(new Option('--session <id>').argParser(parseField(identifier)))
      .addOption(new Option('--user <id>').argParser(parseField(identifier)))
      .addOption(new Option('--pipeline-instance <id>').argParser(parseField(identifier)))
      .addOption(new Option('--budget <units>', "the run's own limit").argParser(parseNumber))
      .option('--dry-run', 'evaluate every stage; reserve and dispatch nothing')
      .action(
        async (
          options: {
            tool: string;
            version?: string;
            input: unknown;
            runId?: string;
            context?: Record<string, string>;
            session?: string;
            user?: string;
            pipelineInstance?: string;
            budget?: number;
            dryRun?: boolean;
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const answer = await s.answer(
            s.api.POST('/runs/execute', {
              body: {
                run_id: options.runId ?? `cli-${randomUUID()}`,
                plan: [
                  {
                    tool_id: options.tool,
                    ...(options.version ? { version: options.version } : {}),
                    input: options.input,
                  },
                ],
                ...(options.context ? { context: options.context } : {}),
                ...(options.session ? { session_id: options.session } : {}),
                ...(options.user ? { user_id: options.user } : {}),
                ...(options.pipelineInstance ? { pipeline_instance_id: options.pipelineInstance } : {}),
                ...(options.budget !== undefined ? { budget_units: options.budget } : {}),
                ...(options.dryRun ? { dry_run: true } : {}),
              },
            }),
          );
          printEnvelope(s, answer);
        },
      ),
  );
  return runs;
}

/**
 * A run envelope is the answer whether or not a step was refused: people see its steps, then the
 * refusal's code; with --json, a refusal's body is printed where every refusal's is.
 */
function printEnvelope(s: Session, answer: Awaited<ReturnType<Session['answer']>>): void {
  const body = answer.body as Envelope | { error: unknown };
  if ('steps' in body && (answer.ok || !s.json)) s.print(body, () => envelopeText(body));
  if (answer.refusal) throw answer.refusal;
}
