import type { ErrorCode } from './error-codes.js';

/**
 * A refusal the domain throws when it cannot return one (a code from the closed set, a message,
 * details); `http/` turns it into a response, the MCP door into a tool result.
 */
export class CodedError extends Error {
  override name = 'CodedError';

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: Record<string, unknown> = {},
  ) {
    super(message);
  }
}
