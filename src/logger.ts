import { pino, type DestinationStream, type Logger, type LoggerOptions } from 'pino';
import { activeTraceFields } from './telemetry/spans.js';

/**
 * The process logger: JSON lines, with credentials and payloads redacted wherever they might
 * appear, so that logs never hold tokens, secrets or raw tool payloads.
 */
export function createLogger(
  level: string,
  options: { traced?: boolean; destination?: DestinationStream } = {},
): Logger {
  const settings: LoggerOptions = {
    level,
    // With traces on, each line names the span it was written in (trace_id, span_id).
    ...(options.traced ? { mixin: activeTraceFields } : {}),
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
  };
  return options.destination ? pino(settings, options.destination) : pino(settings);
}
