import { generateKeyPairSync } from 'node:crypto';

/** A fresh Ed25519 key pair as PEM, as audit checkpoints are signed and checked with. */
export function ed25519Pem(): { privatePem: string; publicPem: string } {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  return {
    privatePem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    publicPem: publicKey.export({ type: 'spki', format: 'pem' }).toString(),
  };
}
