/**
 * Checking the audit log in the browser (SPEC §8.1), with WebCrypto only: a checkpoint's C2SP
 * signed-note signature against the log's verifier key, the C2SP tlog-checkpoint body, a record's
 * RFC 8785 leaf hash and its RFC 9162 inclusion proof. Pure: no DOM, no fetch, so the same code
 * is unit-tested under Node (test/console-tlog.test.ts).
 */

/** A check that failed, saying which. */
export class LogCheckError extends Error {
  override readonly name = 'LogCheckError';
}

const utf8 = new TextEncoder();

/** Standard base64, strictly: anything `atob` would not round-trip is refused. */
export function fromBase64(text: string): Uint8Array {
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0)
    throw new LogCheckError(`not standard base64: ${text.slice(0, 16)}`);
  return Uint8Array.from(atob(text), (char) => char.charCodeAt(0));
}

export function toBase64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}

export const toHex = (bytes: Uint8Array): string => Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');

const equal = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((byte, i) => byte === b[i]);

async function sha256(...parts: Uint8Array[]): Promise<Uint8Array> {
  const joined = new Uint8Array(parts.reduce((total, part) => total + part.length, 0));
  let at = 0;
  for (const part of parts) {
    joined.set(part, at);
    at += part.length;
  }
  return new Uint8Array(await crypto.subtle.digest('SHA-256', joined));
}

// ---- C2SP signed-note (golang.org/x/mod/sumdb/note) -------------------------------------------

const ED25519 = 0x01;

export interface VerifierKey {
  name: string;
  /** The first 4 bytes of SHA-256(name ‖ "\n" ‖ 0x01 ‖ public key). */
  keyId: Uint8Array;
  publicKey: Uint8Array;
}

/** A key name: non-empty, no white space, no `+` (C2SP signed-note). */
const isKeyName = (name: string) => name.length > 0 && !/[\s+]/u.test(name);

/** Parses `<name>+<hex key id>+<base64(0x01 ‖ Ed25519 public key)>`, checking the key id against the key. */
export async function parseVerifierKey(text: string): Promise<VerifierKey> {
  // The key's base64 may itself hold a `+`: the name and id end at the first two.
  const match = /^([^+]*)\+([^+]*)\+(.*)$/su.exec(text);
  if (!match) throw new LogCheckError('a verifier key is <name>+<key id>+<key>');
  const [, name, hexId, encoded] = match as unknown as [string, string, string, string];
  if (!isKeyName(name)) throw new LogCheckError('the verifier key has no valid name');
  if (!/^[0-9a-f]{8}$/.test(hexId)) throw new LogCheckError('the verifier key id is not 8 hex digits');
  const key = fromBase64(encoded);
  if (key.length !== 33 || key[0] !== ED25519) throw new LogCheckError('the verifier key is not an Ed25519 key');
  const keyId = (await sha256(utf8.encode(`${name}\n`), key)).slice(0, 4);
  if (toHex(keyId) !== hexId) throw new LogCheckError('the verifier key id does not match its key');
  return { name, keyId, publicKey: key.slice(1) };
}

export interface NoteSignature {
  name: string;
  keyId: Uint8Array;
  signature: Uint8Array;
}

/** Splits a signed note into its text (what is signed, ending in a newline) and its signature lines. */
export function parseNote(message: string): { text: string; signatures: NoteSignature[] } {
  const split = message.lastIndexOf('\n\n');
  if (split < 0 || !message.endsWith('\n')) throw new LogCheckError('not a signed note');
  const text = message.slice(0, split + 1);
  const signatures = message
    .slice(split + 2, -1)
    .split('\n')
    .map((line) => {
      const match = /^— (\S+) (\S+)$/u.exec(line);
      if (!match || !isKeyName(match[1]!)) throw new LogCheckError(`not a signature line: ${line.slice(0, 40)}`);
      const bytes = fromBase64(match[2]!);
      if (bytes.length < 5) throw new LogCheckError('a signature too short to hold a key id');
      return { name: match[1]!, keyId: bytes.slice(0, 4), signature: bytes.slice(4) };
    });
  return { text, signatures };
}

/**
 * The note's text, once a signature by `key` verifies over it; signatures by other keys are
 * ignored, as `note.Open` does. Throws when none by `key` verifies.
 */
export async function verifyNote(message: string, key: VerifierKey): Promise<string> {
  const { text, signatures } = parseNote(message);
  const ours = signatures.filter((sig) => sig.name === key.name && equal(sig.keyId, key.keyId));
  if (ours.length === 0) throw new LogCheckError(`the note has no signature by ${key.name}`);
  // Copies: the DOM's WebCrypto types take ArrayBuffer-backed views only.
  const publicKey = await crypto.subtle.importKey('raw', new Uint8Array(key.publicKey), { name: 'Ed25519' }, false, [
    'verify',
  ]);
  for (const sig of ours)
    if (await crypto.subtle.verify({ name: 'Ed25519' }, publicKey, new Uint8Array(sig.signature), utf8.encode(text)))
      return text;
  throw new LogCheckError(`the signature by ${key.name} does not verify`);
}

// ---- C2SP tlog-checkpoint ------------------------------------------------------------------------

export interface Checkpoint {
  origin: string;
  size: number;
  rootHash: Uint8Array;
  /** Lines after the root hash, kept as they are. */
  extensions: string[];
}

/** Parses `<origin>\n<tree size>\n<base64 root hash>\n[extension lines]`. */
export function parseCheckpoint(text: string): Checkpoint {
  if (!text.endsWith('\n')) throw new LogCheckError('a checkpoint ends with a newline');
  const [origin, size, root, ...extensions] = text.slice(0, -1).split('\n');
  if (!origin || root === undefined) throw new LogCheckError('a checkpoint has an origin, a size and a root hash');
  if (!/^(0|[1-9][0-9]*)$/.test(size ?? '') || !Number.isSafeInteger(Number(size)))
    throw new LogCheckError('the checkpoint size is not a decimal number');
  const rootHash = fromBase64(root);
  if (rootHash.length !== 32) throw new LogCheckError('the checkpoint root is not a SHA-256 hash');
  return { origin, size: Number(size), rootHash, extensions };
}

// ---- RFC 9162 Merkle tree ------------------------------------------------------------------------

/** SHA-256(0x00 ‖ leaf) (RFC 9162 §2.1.1). */
export const leafHash = (leaf: Uint8Array): Promise<Uint8Array> => sha256(Uint8Array.of(0), leaf);

/** SHA-256(0x01 ‖ left ‖ right). */
export const nodeHash = (left: Uint8Array, right: Uint8Array): Promise<Uint8Array> =>
  sha256(Uint8Array.of(1), left, right);

/**
 * The root an inclusion proof leads to from a leaf (RFC 9162 §2.1.3.2), to compare with a
 * checkpoint's. Sizes go past 32 bits, so halving is arithmetic, not a shift.
 */
export async function rootFromInclusionProof(
  index: number,
  size: number,
  leaf: Uint8Array,
  proof: Uint8Array[],
): Promise<Uint8Array> {
  if (!Number.isSafeInteger(index) || !Number.isSafeInteger(size) || index < 0 || index >= size)
    throw new LogCheckError(`leaf ${index} is not in a tree of ${size}`);
  let fn = index;
  let sn = size - 1;
  let hash = leaf;
  const half = (n: number) => Math.floor(n / 2);
  for (const sibling of proof) {
    if (sn === 0) throw new LogCheckError('the inclusion proof is too long');
    if (fn % 2 === 1 || fn === sn) {
      hash = await nodeHash(sibling, hash);
      while (fn % 2 === 0 && fn !== 0) {
        fn = half(fn);
        sn = half(sn);
      }
    } else hash = await nodeHash(hash, sibling);
    fn = half(fn);
    sn = half(sn);
  }
  if (sn !== 0) throw new LogCheckError('the inclusion proof is too short');
  return hash;
}

// ---- Records --------------------------------------------------------------------------------------

/**
 * RFC 8785 (JCS) canonical JSON of a parsed JSON value: object keys sorted by UTF-16 code units,
 * strings and numbers as ECMAScript's JSON.stringify writes them (which JCS adopts).
 */
export function canonicalJson(value: unknown): string {
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'number' && !Number.isFinite(value)) throw new LogCheckError('JSON has no such number');
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined);
  entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${canonicalJson(v)}`).join(',')}}`;
}

/** A record's leaf hash: SHA-256(0x00 ‖ JCS(record)) (SPEC §8.1). */
export const recordLeafHash = (record: unknown): Promise<Uint8Array> => leafHash(utf8.encode(canonicalJson(record)));

export interface Inclusion {
  leaf_index: number;
  tree_size: number;
  leaf_hash: string;
  proof: string[];
}

export interface InclusionVerdict {
  origin: string;
  treeSize: number;
  leafIndex: number;
  rootHash: string;
}

/**
 * Checks, in this browser, that `record` is leaf `leaf_index` of the tree the signed checkpoint
 * `note` commits to: the note's signature against `verifierKey`, the record's own leaf hash, and
 * the inclusion proof up to the checkpoint's root. Throws a LogCheckError naming the first check
 * that fails.
 */
export async function verifyRecordInclusion(input: {
  note: string;
  verifierKey: string;
  record: unknown;
  inclusion: Inclusion;
}): Promise<InclusionVerdict> {
  const key = await parseVerifierKey(input.verifierKey);
  const checkpoint = parseCheckpoint(await verifyNote(input.note, key));
  if (checkpoint.origin !== key.name)
    throw new LogCheckError(`the checkpoint's origin ${checkpoint.origin} is not the key's name ${key.name}`);
  const { inclusion } = input;
  if (inclusion.tree_size !== checkpoint.size)
    throw new LogCheckError(
      `the proof is for a tree of ${inclusion.tree_size}, the checkpoint's has ${checkpoint.size}`,
    );
  const leaf = await recordLeafHash(input.record);
  if (toBase64(leaf) !== inclusion.leaf_hash) throw new LogCheckError('the record does not hash to its leaf');
  const root = await rootFromInclusionProof(
    inclusion.leaf_index,
    inclusion.tree_size,
    leaf,
    inclusion.proof.map(fromBase64),
  );
  if (!equal(root, checkpoint.rootHash)) throw new LogCheckError("the proof does not lead to the checkpoint's root");
  return {
    origin: checkpoint.origin,
    treeSize: checkpoint.size,
    leafIndex: inclusion.leaf_index,
    rootHash: toBase64(root),
  };
}
