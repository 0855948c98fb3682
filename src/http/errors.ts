import { CodedError } from '../errors/coded-error.js';
import { statusForCode, type ErrorCode } from '../errors/error-codes.js';

export { ERROR_CODES, statusForCode, type ErrorCode } from '../errors/error-codes.js';

/** A refusal raised by the HTTP layer itself: a domain `CodedError` with its status and headers. */
export class ApiError extends CodedError {
  override name = 'ApiError';
  readonly statusCode: number;

  constructor(
    code: ErrorCode,
    message: string,
    details: Record<string, unknown> = {},
    readonly headers: Record<string, string> = {},
  ) {
    super(code, message, details);
    this.statusCode = statusForCode(code);
  }
}

export interface ErrorBody {
  error: { code: ErrorCode; message: string; details: Record<string, unknown> };
}

export function errorBody(code: ErrorCode, message: string, details: Record<string, unknown> = {}): ErrorBody {
  return { error: { code, message, details } };
}
