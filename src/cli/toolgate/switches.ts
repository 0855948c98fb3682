import { Option } from 'commander';
import type { Schemas } from '../../client/index.js';
import { cell, record, table } from './format.js';
import { command, IDEMPOTENCY_KEY, idempotencyHeader, listOptions, type ListOptions } from './help.js';
import { CheckFailed, Session, UsageError } from './session.js';

type KillSwitch = Schemas['KillSwitch'];
const SCOPES = ['global', 'region', 'provider', 'tenant', 'family', 'agent', 'tool'];

function switchRows(switches: KillSwitch[]): string {
  return table(
    ['ID', 'SCOPE', 'TARGET', 'TENANT', 'STATE', 'ARMED_AT', 'REASON'],
    switches.map((k) => [k.id, k.scope, k.target, k.tenant_id ?? '(platform)', k.state, k.armed_at, k.reason]),
  );
}

export function switchesCommand() {
  const switches = command(
    'switches',
    'kill switches: stop calls at their next boundary',
    'toolgate switches arm --scope tool --target web.fetch --reason "incident 7" --copy "Search is paused"',
  );

  switches.addCommand(
    command(
      'arm',
      'arm a kill switch (arming an armed target answers that switch)',
      'toolgate switches arm --scope agent --target a1 --reason "runaway loop" --copy "This assistant is paused"',
    )
      .addOption(new Option('--scope <scope>').choices(SCOPES).makeOptionMandatory())
      .option('--target <target>', 'region, provider, tenant id, family, agent id or tool id (not for global)')
      .option('--tenant <id>', "confine it to a tenant (a tenant-operator's always are)")
      .requiredOption('--reason <text>', 'why, for operators')
      .requiredOption('--copy <text>', 'what refused callers are shown (user_visible_status_copy)')
      .option('--safe-mode <id>', 'safe_degradation_mode_id')
      .option(...IDEMPOTENCY_KEY)
      .action(
        async (
          options: {
            scope: Schemas['KillSwitchScope'];
            target?: string;
            tenant?: string;
            reason: string;
            copy: string;
            safeMode?: string;
            idempotencyKey?: string;
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const armed = await s.call(
            s.api.POST('/kill-switches', {
              params: { header: idempotencyHeader(options) },
              body: {
                scope: options.scope,
                ...(options.target !== undefined ? { target: options.target } : {}),
                ...(options.tenant !== undefined ? { tenant_id: options.tenant } : {}),
                reason: options.reason,
                user_visible_status_copy: options.copy,
                ...(options.safeMode !== undefined ? { safe_degradation_mode_id: options.safeMode } : {}),
              },
            }),
          );
          s.print(armed, () => record(armed));
        },
      ),
  );

  switches.addCommand(
    command(
      'disarm',
      'disarm a switch by id, or every armed switch on a target',
      'toolgate switches disarm ks_3kTMd9 --reason "fixed"',
      'toolgate switches disarm --target web.fetch --reason "fixed"',
    )
      .argument('[id]', 'the switch (or give --target)')
      .requiredOption('--reason <text>', 'why, kept with the switch')
      .option('--target <target>', 'every armed switch on this target')
      .addOption(new Option('--scope <scope>', 'with --target: only switches of this scope').choices(SCOPES))
      .option('--tenant <id>', 'with --target: the switches that apply to this tenant')
      .action(
        async (
          id: string | undefined,
          options: { reason: string; target?: string; scope?: Schemas['KillSwitchScope']; tenant?: string },
          cmd,
        ) => {
          const s = new Session(cmd);
          if (id ? options.target !== undefined : options.target === undefined)
            throw new UsageError('give a switch id, or --target');
          let ids = id ? [id] : [];
          if (!id) {
            const armed = (
              await s.page(true, (cursor) =>
                s.call(
                  s.api.GET('/kill-switches', {
                    params: {
                      query: {
                        state: 'armed',
                        target: options.target,
                        scope: options.scope,
                        tenant_id: options.tenant,
                        limit: 500,
                        cursor,
                      },
                    },
                  }),
                ),
              )
            ).items;
            // A tenant-operator's listing includes the platform-wide switches it cannot disarm: name them, leave them be.
            const { role } = await s.call(s.api.GET('/whoami'));
            const beyond = role === 'platform-operator' ? [] : armed.filter((k) => k.tenant_id === null);
            for (const k of beyond)
              s.note(
                `left ${k.id} (${k.scope} ${k.target}) armed: it is platform-wide, and only a platform-operator disarms it`,
              );
            ids = armed.filter((k) => !beyond.includes(k)).map((k) => k.id);
          }
          const disarmed: KillSwitch[] = [];
          for (const switchId of ids)
            disarmed.push(
              await s.call(
                s.api.POST('/kill-switches/{id}/disarm', {
                  params: { path: { id: switchId } },
                  body: { reason: options.reason },
                }),
              ),
            );
          if (!id && disarmed.length === 0) s.note(`no armed switch on ${options.target}`);
          s.print(id ? disarmed[0] : { items: disarmed }, () => (disarmed.length ? switchRows(disarmed) : ''));
        },
      ),
  );

  switches.addCommand(
    listOptions(
      command('list', 'kill switches, armed and disarmed, newest first', 'toolgate switches list --state armed'),
      500,
    )
      .addOption(new Option('--state <state>').choices(['armed', 'disarmed']))
      .addOption(new Option('--scope <scope>').choices(SCOPES))
      .option('--target <target>')
      .option('--tenant <id>', 'the switches that apply to this tenant')
      .action(
        async (
          options: ListOptions & {
            state?: 'armed' | 'disarmed';
            scope?: Schemas['KillSwitchScope'];
            target?: string;
            tenant?: string;
          },
          cmd,
        ) => {
          const s = new Session(cmd);
          const page = await s.page(
            options.all,
            (cursor) =>
              s.call(
                s.api.GET('/kill-switches', {
                  params: {
                    query: {
                      state: options.state,
                      scope: options.scope,
                      target: options.target,
                      tenant_id: options.tenant,
                      limit: options.limit,
                      cursor,
                    },
                  },
                }),
              ),
            options.cursor,
          );
          s.print(page, () => switchRows(page.items));
          s.more(page.next_cursor);
        },
      ),
  );

  switches.addCommand(
    command('show', 'one kill switch', 'toolgate switches show ks_3kTMd9')
      .argument('<id>')
      .action(async (id: string, _options, cmd) => {
        const s = new Session(cmd);
        const found = await s.call(s.api.GET('/kill-switches/{id}', { params: { path: { id } } }));
        s.print(found, () => record(found));
      }),
  );

  switches.addCommand(
    command(
      'decide',
      'which armed switches stop a call, and which one is blamed (exit 1 when one does)',
      'toolgate switches decide --agent a1 --tool web.fetch',
    )
      .option('--tenant <id>', "default: the caller's tenant")
      .option('--agent <id>')
      .option('--family <name>')
      .option('--tool <id>')
      .action(async (options: { tenant?: string; agent?: string; family?: string; tool?: string }, cmd) => {
        const s = new Session(cmd);
        const decision = await s.call(
          s.api.GET('/kill-switches/decide', {
            params: {
              query: {
                tenant_id: options.tenant,
                agent_id: options.agent,
                family: options.family,
                tool_id: options.tool,
              },
            },
          }),
        );
        s.print(decision, () =>
          decision.ok
            ? 'no armed switch stops this call'
            : `stopped by ${decision.blamed!.id} (${decision.blamed!.scope} ${decision.blamed!.target}): "${cell(decision.blamed!.user_visible_status_copy)}"\n\n${switchRows(decision.matches)}`,
        );
        if (!decision.ok) throw new CheckFailed(`kill_switch_active: ${decision.blamed!.id} stops this call`);
      }),
  );
  return switches;
}
