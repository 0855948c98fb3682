import { createPublicKey, randomBytes, type JsonWebKey, type KeyObject } from 'node:crypto';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Config } from '../config/config.js';

/**
 * How tokens are verified: one HS256 secret, one public key (`TOOLGATE_JWT_PUBLIC_KEY`), or the
 * public keys of a JWKS file, chosen by `kid`.
 */
export type VerificationKeys =
  | { kind: 'secret'; secret: string; development: boolean }
  | { kind: 'public'; key: string; algorithms: Array<'RS256' | 'ES256'> }
  | { kind: 'jwks'; keys: Map<string | undefined, string>; algorithms: Array<'RS256' | 'ES256'> };

/** The public key a token with this `kid` header must be signed by; undefined when there is none. */
export function publicKeyFor(
  keys: Exclude<VerificationKeys, { kind: 'secret' }>,
  kid: string | undefined,
): string | undefined {
  // One configured key is the only candidate, whatever `kid` the identity provider put in the
  // header (most add one); the signature check still decides.
  if (keys.kind === 'public') return keys.key;
  return keys.keys.get(kid);
}

const DEV_SECRET_FILE = 'dev-jwt-secret';

/**
 * Resolves the verification keys from configuration. With nothing configured outside
 * production, a development secret is kept in the data folder so that `npm start` and
 * `npm run token` agree on it.
 */
export async function loadVerificationKeys(config: Config): Promise<VerificationKeys> {
  const { jwt } = config;
  if (jwt.secret) return { kind: 'secret', secret: jwt.secret, development: false };
  if (jwt.publicKey) {
    try {
      const key = createPublicKey(jwt.publicKey);
      return { kind: 'public', key: jwt.publicKey, algorithms: algorithmsFor([key]) };
    } catch (error) {
      throw new Error(`TOOLGATE_JWT_PUBLIC_KEY: ${(error as Error).message}`);
    }
  }
  if (jwt.jwksFile) return loadJwks(jwt.jwksFile);
  return { kind: 'secret', secret: await developmentSecret(config.dataDir, true), development: true };
}

/** Reads the development secret, creating it when `create` is set; undefined when absent. */
export async function developmentSecret(dataDir: string, create: true): Promise<string>;
export async function developmentSecret(dataDir: string, create: false): Promise<string | undefined>;
export async function developmentSecret(dataDir: string, create: boolean): Promise<string | undefined> {
  const file = join(dataDir, DEV_SECRET_FILE);
  try {
    return (await readFile(file, 'utf8')).trim();
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    if (!create) return undefined;
  }
  await mkdir(dataDir, { recursive: true });
  const secret = randomBytes(32).toString('base64url');
  await writeFile(file, `${secret}\n`, { mode: 0o600, flag: 'wx' }).catch(async (error: NodeJS.ErrnoException) => {
    if (error.code !== 'EEXIST') throw error;
  });
  return (await readFile(file, 'utf8')).trim();
}

async function loadJwks(file: string): Promise<VerificationKeys> {
  let parsed: { keys?: JsonWebKey[] };
  try {
    parsed = JSON.parse(await readFile(file, 'utf8')) as { keys?: JsonWebKey[] };
  } catch (error) {
    throw new Error(`TOOLGATE_JWT_JWKS_FILE: cannot read ${file}: ${(error as Error).message}`);
  }
  if (!Array.isArray(parsed.keys) || parsed.keys.length === 0) {
    throw new Error(`TOOLGATE_JWT_JWKS_FILE: ${file} holds no keys`);
  }
  const keys = new Map<string | undefined, string>();
  const found: KeyObject[] = [];
  try {
    for (const jwk of parsed.keys) {
      if (jwk.use !== undefined && jwk.use !== 'sig') continue;
      const key = createPublicKey({ key: jwk, format: 'jwk' });
      found.push(key);
      keys.set(
        typeof jwk.kid === 'string' ? jwk.kid : undefined,
        key.export({ type: 'spki', format: 'pem' }).toString(),
      );
    }
    if (keys.size === 1 && !keys.has(undefined)) keys.set(undefined, [...keys.values()][0]!);
    return { kind: 'jwks', keys, algorithms: algorithmsFor(found) };
  } catch (error) {
    throw new Error(`TOOLGATE_JWT_JWKS_FILE: ${file}: ${(error as Error).message}`);
  }
}

/** RS256 for RSA keys, ES256 for P-256 ones; any other key would verify nothing, so it is refused. */
function algorithmsFor(keys: KeyObject[]): Array<'RS256' | 'ES256'> {
  const algorithms = new Set<'RS256' | 'ES256'>();
  for (const key of keys) {
    if (key.asymmetricKeyType === 'rsa') algorithms.add('RS256');
    else if (key.asymmetricKeyType === 'ec' && key.asymmetricKeyDetails?.namedCurve === 'prime256v1')
      algorithms.add('ES256');
    else {
      const type =
        key.asymmetricKeyType === 'ec'
          ? `ec ${key.asymmetricKeyDetails?.namedCurve ?? 'unknown curve'}`
          : (key.asymmetricKeyType ?? 'unknown');
      throw new Error(`unsupported key type ${type}: use RSA (RS256) or P-256 (ES256)`);
    }
  }
  return [...algorithms];
}
