import { CommanderError } from 'commander';
import { GatewayUnreachableError, ToolgateError } from '../../client/index.js';
import { loadClientTarget } from '../../config/config.js';
import { toolgateProgram } from './program.js';
import { BadAnswer, CheckFailed, UsageError } from './session.js';
import { jsonText, sayOnStderr } from './terminal.js';

/** `toolgate …`: runs one command; answers the exit status: 0 done, 1 refused, 2 usage mistake, 3 gateway unreachable. */
export async function runToolgate(argv: string[]): Promise<number> {
  const program = toolgateProgram();
  try {
    await program.parseAsync(argv);
    return 0;
  } catch (error) {
    const say = (line: string) => sayOnStderr(`toolgate: ${line}`);
    if (error instanceof CommanderError) return error.exitCode === 0 ? 0 : 2;
    if (error instanceof ToolgateError) {
      // Scripts read the answer on stdout as the API gave it; people read the code and message.
      if (program.opts().json) process.stdout.write(`${jsonText(error.body, 2)}\n`);
      say(`${error.code}: ${error.message}`);
      const details = JSON.stringify(error.details);
      if (details !== '{}')
        say(`details: ${details.length > 200 ? `${details.slice(0, 200)}… (--json shows the whole answer)` : details}`);
      if (error.code === 'unauthenticated' && !program.opts().token && !loadClientTarget().token)
        say('hint: set TOOLGATE_TOKEN, or pipe the token to --token-stdin');
      return 1;
    }
    if (error instanceof CheckFailed || error instanceof BadAnswer) {
      say(error.message);
      return 1;
    }
    if (error instanceof UsageError) {
      say(error.message);
      return 2;
    }
    if (error instanceof GatewayUnreachableError) {
      say(error.message);
      return 3;
    }
    say(error instanceof Error ? error.message : String(error));
    return 3;
  }
}
