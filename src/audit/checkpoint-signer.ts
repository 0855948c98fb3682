import { createHash, createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';
import { canonicalJson } from './audit-hash.js';

/**
 * A checkpoint of the audit chain: the chain held row `seq` with `hash` at `at`. With `leaf_index`, it
 * seals a range of leaves instead: the record `seq` is the leaf at `leaf_index`, and `hash` its leaf hash.
 */
export interface Checkpoint {
  id: string;
  seq: number;
  hash: string;
  leaf_index?: number;
  at: string;
  /** The signing key's id (a fingerprint of its public key); null for an unsigned checkpoint. */
  key_id: string | null;
  /** Ed25519 over the checkpoint's canonical JSON (without the signature), base64url. */
  signature: string | null;
  created_by: string;
}

/** Why a checkpoint is not trusted. */
export type CheckpointDistrust = 'bad_signature' | 'unknown_key' | 'unsigned';

/** The domain tag keeps a checkpoint signature from being replayed as a signature over anything else. */
const SIGNED_PREFIX = 'toolgate-audit-checkpoint-v1\n';
/** A seal of leaves is signed apart, so that it never passes for a checkpoint of the chain. */
const SIGNED_LEAF_PREFIX = 'toolgate-audit-leaf-seal-v1\n';

function signedBytes(checkpoint: Omit<Checkpoint, 'signature' | 'created_by'>): Buffer {
  const { id, seq, hash, at, key_id, leaf_index } = checkpoint;
  if (leaf_index === undefined)
    return Buffer.from(SIGNED_PREFIX + canonicalJson({ id, seq, hash, at, key_id }), 'utf8');
  return Buffer.from(SIGNED_LEAF_PREFIX + canonicalJson({ id, seq, hash, at, key_id, leaf_index }), 'utf8');
}

/** A key's id: the first 16 hex digits of the SHA-256 of its public key (SPKI DER). */
export function keyIdOf(publicKey: KeyObject): string {
  return createHash('sha256')
    .update(publicKey.export({ type: 'spki', format: 'der' }))
    .digest('hex')
    .slice(0, 16);
}

/**
 * Signs checkpoints with the configured Ed25519 key and checks them against it and any earlier
 * keys still trusted. Without a signing key, checkpoints are unsigned and trusted as such.
 */
export class CheckpointSigner {
  private readonly privateKey: KeyObject | undefined;
  private readonly trusted = new Map<string, KeyObject>();
  readonly keyId: string | null;

  constructor(options: { signingKeyPem?: string | undefined; verifyKeysPem?: string[] | undefined } = {}) {
    this.privateKey = options.signingKeyPem === undefined ? undefined : createPrivateKey(options.signingKeyPem);
    if (this.privateKey !== undefined && this.privateKey.asymmetricKeyType !== 'ed25519') {
      throw new Error('the audit signing key must be an Ed25519 private key');
    }
    const publicKeys = (options.verifyKeysPem ?? []).map((pem) => createPublicKey(pem));
    if (this.privateKey !== undefined) publicKeys.unshift(createPublicKey(this.privateKey));
    for (const key of publicKeys) this.trusted.set(keyIdOf(key), key);
    this.keyId = this.privateKey === undefined ? null : keyIdOf(createPublicKey(this.privateKey));
  }

  get signs(): boolean {
    return this.privateKey !== undefined;
  }

  sign(unsigned: Omit<Checkpoint, 'key_id' | 'signature'>): Checkpoint {
    if (this.privateKey === undefined) return { ...unsigned, key_id: null, signature: null };
    const withKey = { ...unsigned, key_id: this.keyId };
    return { ...withKey, signature: sign(null, signedBytes(withKey), this.privateKey).toString('base64url') };
  }

  /** Null when the checkpoint is trusted; otherwise why not. Unsigned ones are trusted only when nothing signs. */
  distrust(checkpoint: Checkpoint): CheckpointDistrust | null {
    if (checkpoint.signature === null || checkpoint.key_id === null) return this.trusted.size > 0 ? 'unsigned' : null;
    const key = this.trusted.get(checkpoint.key_id);
    if (key === undefined) return 'unknown_key';
    const signature = Buffer.from(checkpoint.signature, 'base64url');
    return verify(null, signedBytes(checkpoint), key, signature) ? null : 'bad_signature';
  }
}
