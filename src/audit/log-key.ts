import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { NoteSigner } from './signed-note.js';

const DEV_KEY_FILE = 'dev-audit-signing-key.pem';

/**
 * The signer of the log's checkpoints: the configured Ed25519 key, or outside production (configuration
 * refuses production without one) a development key kept in the data folder, as the JWT secret is.
 */
export function logSigner(options: { origin: string; signingKeyPem: string | undefined; dataDir: string }): NoteSigner {
  const pem = options.signingKeyPem ?? developmentKey(options.dataDir);
  return new NoteSigner(options.origin, createPrivateKey(pem));
}

function developmentKey(dataDir: string): string {
  // An in-memory database keeps nothing, and neither does its key.
  if (dataDir === '' || dataDir.startsWith('memory://')) return newKey();
  const file = join(dataDir, DEV_KEY_FILE);
  try {
    return readFileSync(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
  }
  mkdirSync(dataDir, { recursive: true });
  try {
    writeFileSync(file, newKey(), { mode: 0o600, flag: 'wx' });
  } catch (error) {
    // Another process of this data folder made it first.
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
  }
  return readFileSync(file, 'utf8');
}

function newKey(): string {
  return generateKeyPairSync('ed25519').privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
}
