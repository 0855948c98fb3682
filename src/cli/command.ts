import { ConfigError, loadConfig, type Config } from '../config/config.js';

/** The shared ends of toolgate's command-line tools: usage errors and configuration. */
export interface Command {
  /** Prints the problem and the usage, and exits 2. */
  fail(message: string): never;
  /** The configuration, or a usage failure naming the bad variable. */
  config(): Config;
}

export function command(name: string, usage: string): Command {
  const fail = (message: string): never => {
    process.stderr.write(`${name}: ${message}\n${usage}\n`);
    process.exit(2);
  };
  return {
    fail,
    config: () => {
      try {
        return loadConfig();
      } catch (error) {
        if (error instanceof ConfigError) fail(error.message);
        throw error;
      }
    },
  };
}
