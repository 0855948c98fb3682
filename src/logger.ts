import { pino, type Logger } from 'pino';

/**
 * The process logger: JSON lines, with credentials and payloads redacted wherever they might
 * appear, so that logs never hold tokens, secrets or raw tool payloads.
 */
export function createLogger(level: string): Logger {
  return pino({
    level,
    base: { service: 'toolgate' },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: {
      paths: [
        'req.headers.authorization',
        'req.headers.cookie',
        'headers.authorization',
        'authorization',
        '*.authorization',
        'token',
        '*.token',
        'secret',
        '*.secret',
        'password',
        '*.password',
        'input',
        '*.input',
        'output',
        '*.output',
        'body',
        '*.body',
      ],
      censor: '[redacted]',
    },
  });
}
