import type { ErrorCode } from './error-codes.js';

/** An expected refusal, returned as a value: only infrastructure faults throw. */
export type Denial = {
  ok: false;
  code: ErrorCode;
  message: string;
  details?: Record<string, unknown>;
  retryAfterSeconds?: number;
};

export type Decision = { ok: true } | Denial;
