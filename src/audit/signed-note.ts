import { createHash, createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';

/**
 * C2SP signed-note with Ed25519 (the format of golang.org/x/mod/sumdb/note), and the C2SP tlog-checkpoint
 * body it signs: what witnesses and any note verifier read. https://c2sp.org/signed-note, https://c2sp.org/tlog-checkpoint
 */
const ED25519 = 0x01;
const SIGNATURE_PREFIX = '\u2014 ';
const PKCS8_ED25519 = Buffer.from('302e020100300506032b657004220420', 'hex');
const SPKI_ED25519 = Buffer.from('302a300506032b6570032100', 'hex');

/** A name a note may be signed under: non-empty, no `+`, no spaces or control characters. */
const KEY_NAME = /^[^\s+\p{Cc}]+$/u;

function rawPublicKey(key: KeyObject): Buffer {
  return key.export({ format: 'der', type: 'spki' }).subarray(SPKI_ED25519.length);
}

/** The 4-byte key hash that names a key in its signatures: SHA-256(name ‖ "\n" ‖ 0x01 ‖ public key). */
function keyHash(name: string, publicKey: Buffer): Buffer {
  return createHash('sha256')
    .update(`${name}\n`)
    .update(Buffer.from([ED25519]))
    .update(publicKey)
    .digest()
    .subarray(0, 4);
}

/** The verifier key of an Ed25519 public key under a name: `<name>+<hex key hash>+<base64(0x01 ‖ key)>`. */
export function verifierKeyOf(name: string, publicKey: KeyObject): string {
  const raw = rawPublicKey(publicKey);
  return `${name}+${keyHash(name, raw).toString('hex')}+${Buffer.concat([Buffer.from([ED25519]), raw]).toString('base64')}`;
}

/** Signs notes under a name with an Ed25519 key. */
export class NoteSigner {
  readonly verifierKey: string;
  private readonly hash: Buffer;

  constructor(
    readonly name: string,
    private readonly privateKey: KeyObject,
  ) {
    if (!KEY_NAME.test(name)) throw new Error(`"${name}" cannot name a signed note's key`);
    if (privateKey.asymmetricKeyType !== 'ed25519') throw new Error('a note signing key must be Ed25519');
    this.hash = keyHash(name, rawPublicKey(createPublicKey(privateKey)));
    this.verifierKey = verifierKeyOf(name, createPublicKey(privateKey));
  }

  /** From a `PRIVATE+KEY+<name>+<hash>+<base64(0x01 ‖ seed)>` key, as golang.org/x/mod/sumdb/note writes them. */
  static fromNoteKey(encoded: string): NoteSigner {
    const [private_, key, name, , ...rest] = encoded.split('+');
    const data = rest.join('+');
    const seed = Buffer.from(data, 'base64');
    if (private_ !== 'PRIVATE' || key !== 'KEY' || name === undefined || seed.length !== 33 || seed[0] !== ED25519)
      throw new Error('not an Ed25519 note signing key');
    const privateKey = createPrivateKey({
      key: Buffer.concat([PKCS8_ED25519, seed.subarray(1)]),
      format: 'der',
      type: 'pkcs8',
    });
    return new NoteSigner(name, privateKey);
  }

  /** The note: its text, a blank line, and this key's signature line. */
  sign(text: string): string {
    assertNoteText(text);
    const signature = sign(null, Buffer.from(text, 'utf8'), this.privateKey);
    return `${text}\n${SIGNATURE_PREFIX}${this.name} ${Buffer.concat([this.hash, signature]).toString('base64')}\n`;
  }
}

function assertNoteText(text: string): void {
  // eslint-disable-next-line no-control-regex
  if (!text.endsWith('\n') || /[\u0000-\u0009\u000b-\u001f\u007f]/.test(text))
    throw new Error("a note's text ends with a newline and holds no other control character");
}

/**
 * The text of a note signed by the key a verifier key names, or undefined when no valid signature of
 * that key is on it (other keys' signatures, such as witnesses' cosignatures, are left alone).
 */
export function openNote(note: string, verifierKey: string): string | undefined {
  const [name, hashHex, ...rest] = verifierKey.split('+');
  const key = Buffer.from(rest.join('+'), 'base64');
  if (name === undefined || hashHex === undefined || key.length !== 33 || key[0] !== ED25519) return undefined;
  const publicKey = key.subarray(1);
  if (keyHash(name, publicKey).toString('hex') !== hashHex) return undefined;
  const split = note.lastIndexOf('\n\n');
  if (split < 0) return undefined;
  const text = note.slice(0, split + 1);
  const lines = note.slice(split + 2).split('\n');
  if (lines.pop() !== '') return undefined;
  const spki = createPublicKey({ key: Buffer.concat([SPKI_ED25519, publicKey]), format: 'der', type: 'spki' });
  for (const line of lines) {
    if (!line.startsWith(SIGNATURE_PREFIX)) return undefined;
    const [signer, blob] = line.slice(SIGNATURE_PREFIX.length).split(' ');
    const bytes = Buffer.from(blob ?? '', 'base64');
    if (signer !== name || bytes.length !== 68 || bytes.subarray(0, 4).toString('hex') !== hashHex) continue;
    if (verify(null, Buffer.from(text, 'utf8'), spki, bytes.subarray(4))) return text;
  }
  return undefined;
}

/** A tree head as a C2SP tlog-checkpoint body names it. */
export interface TreeHead {
  origin: string;
  size: number;
  root: Buffer;
}

export function checkpointText(head: TreeHead): string {
  return `${head.origin}\n${head.size}\n${head.root.toString('base64')}\n`;
}

/** A checkpoint body's origin, size and root; undefined if it is not one. Extension lines are ignored. */
export function parseCheckpoint(text: string): TreeHead | undefined {
  const [origin, size, root] = text.split('\n');
  if (!origin || !size || !/^(0|[1-9][0-9]*)$/.test(size) || root === undefined) return undefined;
  const hash = Buffer.from(root, 'base64');
  if (hash.length !== 32 || hash.toString('base64') !== root) return undefined;
  return { origin, size: Number(size), root: hash };
}
