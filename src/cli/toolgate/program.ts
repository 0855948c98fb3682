import { type Command } from 'commander';
import { approvalsCommand } from './approvals.js';
import { auditCommand } from './audit.js';
import { budgetsCommand } from './budgets.js';
import { record } from './format.js';
import { grantsCommand } from './grants.js';
import { command } from './help.js';
import { policyCommand } from './policy.js';
import { runsCommand } from './runs.js';
import { DEFAULT_URL, Session, UsageError } from './session.js';
import { switchesCommand } from './switches.js';
import { tokenCommand } from './token.js';
import { printableLines } from './terminal.js';
import { toolsCommand } from './tools.js';

/** The token piped to `--token-stdin`: one line, without its newline; never read from a terminal. */
async function tokenFromStdin(): Promise<string> {
  if (process.stdin.isTTY) throw new UsageError('--token-stdin reads a pipe or a file, not the terminal');
  let text = '';
  for await (const chunk of process.stdin) text += String(chunk);
  const token = text.trim();
  if (!token || /\s/.test(token)) throw new UsageError('--token-stdin: expected one token on stdin');
  return token;
}

/** The `toolgate` command tree: one group per resource an operator manages. */
export function toolgateProgram(): Command {
  const program = command(
    'toolgate',
    'Drive a toolgate gateway: tools, grants, kill switches, budgets, policy, approvals, runs and the audit log.',
    'export TOOLGATE_URL=http://127.0.0.1:8080 TOOLGATE_TOKEN=$(toolgate token --kind operator --role platform-operator --tenant t1)',
    'toolgate grants create --agent a1 --tool web.fetch --scope per-tenant --ttl 7d --reason "pilot"',
    'toolgate grants list --json | jq -r ".items[].id"',
  )
    .option('--url <url>', 'the gateway (default: TOOLGATE_URL)')
    .option('--token-stdin', 'read the bearer token from stdin (a pipe or a file), instead of TOOLGATE_TOKEN')
    .option(
      '--token <jwt>',
      'bearer token; a command line is seen by other users (ps) and kept in shell history: prefer TOOLGATE_TOKEN or --token-stdin',
    )
    .option('--json', "print the API's answer as JSON, for scripts")
    .hook('preAction', async (self) => {
      if (!self.opts().tokenStdin) return;
      if (self.opts().token !== undefined) throw new UsageError('give one of --token and --token-stdin');
      self.setOptionValue('token', await tokenFromStdin());
    })
    .addHelpText(
      'after',
      `\nIt talks to TOOLGATE_URL (default ${DEFAULT_URL}) as TOOLGATE_TOKEN (or the token piped to --token-stdin:\n` +
        '`vault read -field=token secret/toolgate | toolgate --token-stdin …`), and never asks anything.\n' +
        "Exit status: 0 done; 1 refused (the API's code and message on stderr); 2 a usage mistake;\n" +
        '3 the gateway could not be reached (the URL tried on stderr).',
    );

  program.addCommand(
    command('whoami', 'what the gateway makes of the token', 'toolgate whoami').action(async (_options, cmd) => {
      const s = new Session(cmd);
      const principal = await s.call(s.api.GET('/whoami'));
      s.print(principal, () => record(principal));
    }),
  );
  for (const group of [
    toolsCommand(),
    grantsCommand(),
    switchesCommand(),
    budgetsCommand(),
    policyCommand(),
    approvalsCommand(),
    runsCommand(),
    auditCommand(),
    tokenCommand(),
  ]) {
    program.addCommand(group);
  }
  // Usage mistakes exit 2 everywhere; a group named without a command shows its help.
  const everyCommand = (cmd: Command): Command[] => [cmd, ...cmd.commands.flatMap(everyCommand)];
  for (const cmd of everyCommand(program)) {
    cmd
      .exitOverride()
      .showHelpAfterError('(add --help for usage)')
      .configureHelp({ showGlobalOptions: true })
      // A usage error quotes the arguments, which a script may have taken from anywhere.
      .configureOutput({ outputError: (text, write) => write(printableLines(text)) });
    if (cmd.commands.length > 0 && cmd !== program) cmd.action(() => cmd.help({ error: true }));
  }
  return program;
}
