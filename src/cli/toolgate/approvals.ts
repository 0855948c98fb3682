import { Option } from 'commander';
import type { Schemas } from '../../client/index.js';
import { cell, record, table } from './format.js';
import { command, listOptions, type ListOptions } from './help.js';
import { Session } from './session.js';

type Approval = Schemas['Approval'];

function approvalRows(approvals: Approval[]): string {
  return table(
    ['ID', 'KIND', 'RUN', 'AGENT', 'TOOL', 'STATUS', 'PROPOSED_BY', 'EXPIRES_AT'],
    approvals.map((a) => [
      a.id,
      a.kind,
      a.run_id,
      a.agent_id,
      a.tool_id ? `${a.tool_id}@${a.tool_version}` : undefined,
      a.status,
      a.proposed_by,
      a.expires_at,
    ]),
  );
}

export function approvalsCommand() {
  const approvals = command(
    'approvals',
    'proposed actions waiting for a human, and their decisions',
    'toolgate approvals list --status pending',
  );

  approvals.addCommand(
    listOptions(command('list', 'approvals, newest first', 'toolgate approvals list --status pending'), 200)
      .option('--tenant <id>', 'platform-operators: one tenant')
      .addOption(new Option('--status <status>').choices(['pending', 'approved', 'rejected', 'expired', 'cancelled']))
      .addOption(new Option('--kind <kind>').choices(['tool_call', 'handoff']))
      .option('--run <id>')
      .action(
        async (
          options: ListOptions & {
            tenant?: string;
            status?: Approval['status'];
            kind?: Approval['kind'];
            run?: string;
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const page = await s.page(
            options.all,
            (cursor) =>
              s.call(
                s.api.GET('/approvals', {
                  params: {
                    query: {
                      tenant_id: options.tenant,
                      status: options.status,
                      kind: options.kind,
                      run_id: options.run,
                      limit: options.limit,
                      cursor,
                    },
                  },
                }),
              ),
            options.cursor,
          );
          s.print(page, () => approvalRows(page.items));
          s.more(page.next_cursor);
        },
      ),
  );

  approvals.addCommand(
    command('show', 'one approval, with the exact input it would let through', 'toolgate approvals show apr_Xw2b')
      .argument('<id>')
      .action(async (id: string, _options, cmd) => {
        const s = new Session(cmd);
        const approval = await s.call(s.api.GET('/approvals/{id}', { params: { path: { id } } }));
        s.print(approval, () => record(approval));
      }),
  );

  for (const [verb, path, what] of [
    ['approve', '/approvals/{id}/approve', 'approve a proposed action (never your own); the run may then be resumed'],
    ['reject', '/approvals/{id}/reject', 'reject a proposed action; its run is cancelled'],
  ] as const) {
    approvals.addCommand(
      command(verb, what, `toolgate approvals ${verb} apr_Xw2b --reason "checked with the customer"`)
        .argument('<id>')
        .requiredOption('--reason <text>', 'the rationale, kept with the decision')
        .action(async (id: string, options: { reason: string }, cmd) => {
          const s = new Session(cmd);
          const decided = await s.call(
            s.api.POST(path, { params: { path: { id } }, body: { rationale: options.reason } }),
          );
          s.print(decided, () => `${decided.id} ${decided.status} by ${cell(decided.decided_by)}`);
        }),
    );
  }
  return approvals;
}
