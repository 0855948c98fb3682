import { Option } from 'commander';
import type { Schemas } from '../../client/index.js';
import { parseNumber, record, table } from './format.js';
import { command, IDEMPOTENCY_KEY, idempotencyHeader, listOptions, type ListOptions } from './help.js';
import { Session, UsageError } from './session.js';

type Budget = Schemas['Budget'];

function budgetRows(budgets: Budget[]): string {
  return table(
    ['ID', 'TENANT', 'SCOPE', 'SUBJECT', 'PERIOD', 'LIMIT', 'SPENT', 'RESERVED', 'PERIOD_END'],
    budgets.map((b) => [
      b.id,
      b.tenant_id,
      b.scope,
      b.agent_id ?? b.run_id,
      b.period,
      b.limit_units,
      b.spent_units,
      b.reserved_units,
      b.period_end,
    ]),
  );
}

const limits = (cmd: ReturnType<typeof command>) =>
  cmd
    .addOption(new Option('--warn-ratio <ratio>', 'warn from this share of the limit on (0-1)').argParser(parseNumber))
    .addOption(new Option('--grace <units>', 'how far past the limit calls are still admitted').argParser(parseNumber));

export function budgetsCommand() {
  const budgets = command(
    'budgets',
    'cost-unit limits on a tenant, an agent or a run',
    'toolgate budgets create --scope agent --agent a1 --period day --limit 500',
  );

  budgets.addCommand(
    limits(
      command(
        'create',
        'create a budget (an identical one answers the existing budget)',
        'toolgate budgets create --scope tenant --period month --limit 100000',
      )
        .addOption(new Option('--scope <scope>').choices(['tenant', 'agent', 'run']).makeOptionMandatory())
        .option('--agent <id>', 'agent scope: the agent')
        .option('--run <id>', 'run scope: the run')
        .addOption(new Option('--period <period>').choices(['day', 'month', 'total']).makeOptionMandatory())
        .addOption(
          new Option('--limit <units>', 'the limit in cost units').argParser(parseNumber).makeOptionMandatory(),
        )
        .option('--tenant <id>', 'platform-operators: another tenant')
        .option(...IDEMPOTENCY_KEY),
    ).action(
      async (
        options: {
          scope: Budget['scope'];
          agent?: string;
          run?: string;
          period: Budget['period'];
          limit: number;
          warnRatio?: number;
          grace?: number;
          tenant?: string;
          idempotencyKey?: string;
        },
        cmd,
      ) => {
        const s = new Session(cmd);
        const budget = await s.call(
          s.api.POST('/budgets', {
            params: { header: idempotencyHeader(options) },
            body: {
              scope: options.scope,
              period: options.period,
              limit_units: options.limit,
              ...(options.agent !== undefined ? { agent_id: options.agent } : {}),
              ...(options.run !== undefined ? { run_id: options.run } : {}),
              ...(options.tenant !== undefined ? { tenant_id: options.tenant } : {}),
              ...(options.warnRatio !== undefined ? { warn_ratio: options.warnRatio } : {}),
              ...(options.grace !== undefined ? { grace_units: options.grace } : {}),
            },
          }),
        );
        s.print(budget, () => record(budget));
      },
    ),
  );

  budgets.addCommand(
    listOptions(
      command('list', 'live budgets with their usage, newest first', 'toolgate budgets list --scope agent'),
      500,
    )
      .option('--tenant <id>')
      .addOption(new Option('--scope <scope>').choices(['tenant', 'agent', 'run']))
      .option('--agent <id>')
      .option('--run <id>')
      .addOption(new Option('--period <period>').choices(['day', 'month', 'total']))
      .action(
        async (
          options: ListOptions & {
            tenant?: string;
            scope?: Budget['scope'];
            agent?: string;
            run?: string;
            period?: Budget['period'];
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const page = await s.page(
            options.all,
            (cursor) =>
              s.call(
                s.api.GET('/budgets', {
                  params: {
                    query: {
                      tenant_id: options.tenant,
                      scope: options.scope,
                      agent_id: options.agent,
                      run_id: options.run,
                      period: options.period,
                      limit: options.limit,
                      cursor,
                    },
                  },
                }),
              ),
            options.cursor,
          );
          s.print(page, () => budgetRows(page.items));
          s.more(page.next_cursor);
        },
      ),
  );

  budgets.addCommand(
    command('show', "a budget with its current period's usage", 'toolgate budgets show bud_7Hs2kq')
      .argument('<id>')
      .action(async (id: string, _options, cmd) => {
        const s = new Session(cmd);
        const budget = await s.call(s.api.GET('/budgets/{id}', { params: { path: { id } } }));
        s.print(budget, () => record(budget));
      }),
  );

  budgets.addCommand(
    limits(
      command(
        'update',
        "change a budget's limits; the others keep their values",
        'toolgate budgets update bud_7Hs2kq --limit 800',
      )
        .argument('<id>')
        .addOption(new Option('--limit <units>').argParser(parseNumber)),
    ).action(async (id: string, options: { limit?: number; warnRatio?: number; grace?: number }, cmd) => {
      const s = new Session(cmd);
      const body = {
        ...(options.limit !== undefined ? { limit_units: options.limit } : {}),
        ...(options.warnRatio !== undefined ? { warn_ratio: options.warnRatio } : {}),
        ...(options.grace !== undefined ? { grace_units: options.grace } : {}),
      };
      if (Object.keys(body).length === 0)
        throw new UsageError('give at least one of --limit, --warn-ratio and --grace');
      const budget = await s.call(s.api.PUT('/budgets/{id}', { params: { path: { id } }, body }));
      s.print(budget, () => record(budget));
    }),
  );

  budgets.addCommand(
    command(
      'delete',
      'remove a budget (it stops applying at once; its history stays)',
      'toolgate budgets delete bud_7Hs2kq',
    )
      .argument('<id>')
      .action(async (id: string, _options, cmd) => {
        const s = new Session(cmd);
        const budget = await s.call(s.api.DELETE('/budgets/{id}', { params: { path: { id } } }));
        s.print(budget, () => `removed ${budget.id} at ${budget.removed_at}`);
      }),
  );
  return budgets;
}
