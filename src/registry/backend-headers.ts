/** A backend names a secret this gateway was not started with: a configuration fault, not a denial. */
export class MissingSecretError extends Error {
  override name = 'MissingSecretError';
  constructor(
    readonly toolId: string,
    readonly secretName: string,
  ) {
    super(`tool ${toolId} needs ${secretName}, which is not set on this gateway`);
  }
}

/**
 * The headers to send to a backend, with `{"from_env": NAME}` values replaced by the secrets
 * snapshot taken at start-up. The result holds secrets: pass it to the backend client only,
 * never to a log, an audit event or a response.
 */
export function resolveBackendHeaders(
  toolId: string,
  backend: { headers: Record<string, unknown> } | null,
  secrets: Readonly<Record<string, string>>,
): Record<string, string> {
  const resolved: Record<string, string> = {};
  for (const [name, value] of Object.entries(backend?.headers ?? {})) {
    if (typeof value === 'string') {
      resolved[name] = value;
      continue;
    }
    const envName = (value as { from_env?: unknown } | null)?.from_env;
    if (typeof envName !== 'string')
      throw new Error(`tool ${toolId}: header ${name} is neither a string nor {from_env}`);
    const secret = secrets[envName];
    if (secret === undefined) throw new MissingSecretError(toolId, envName);
    resolved[name] = secret;
  }
  return resolved;
}
