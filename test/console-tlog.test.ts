import type { webcrypto } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  canonicalJson,
  leafHash,
  LogCheckError,
  nodeHash,
  parseCheckpoint,
  parseNote,
  parseVerifierKey,
  recordLeafHash,
  rootFromInclusionProof,
  toBase64,
  toHex,
  verifyNote,
  verifyRecordInclusion,
} from '../console/src/tlog.js';

// The console's verifier of the audit log (SPEC §8.1), against published vectors and a log built here.

const hex = (text: string) => Uint8Array.from(text.match(/../g) ?? [], (byte) => parseInt(byte, 16));
const utf8 = (text: string) => new TextEncoder().encode(text);

// RFC 6962's reference tree (certificate-transparency's merkle_tree_test): 8 leaves and the root of each prefix.
const CT_LEAVES = [
  '',
  '00',
  '10',
  '2021',
  '3031',
  '40414243',
  '5051525354555657',
  '606162636465666768696a6b6c6d6e6f',
].map(hex);
const CT_ROOTS = [
  '6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d',
  'fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125',
  'aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77',
  'd37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7',
  '4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4',
  '76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef',
  'ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c',
  '5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328',
];
// Its published inclusion proofs in the tree of 8.
const CT_PROOFS: Array<[number, string[]]> = [
  [
    0,
    [
      '96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7',
      '5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e',
      '6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4',
    ],
  ],
  [
    5,
    [
      'bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b',
      'ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0',
      'd37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7',
    ],
  ],
];

/** MTH and PATH as RFC 9162 §2.1.1 and §2.1.3.1 define them, recursively: the reference the verifier is held to. */
async function mth(hashes: Uint8Array[]): Promise<Uint8Array> {
  if (hashes.length === 1) return hashes[0]!;
  const k = 2 ** Math.floor(Math.log2(hashes.length - 1));
  return nodeHash(await mth(hashes.slice(0, k)), await mth(hashes.slice(k)));
}
async function path(m: number, hashes: Uint8Array[]): Promise<Uint8Array[]> {
  if (hashes.length === 1) return [];
  const k = 2 ** Math.floor(Math.log2(hashes.length - 1));
  return m < k
    ? [...(await path(m, hashes.slice(0, k))), await mth(hashes.slice(k))]
    : [...(await path(m - k, hashes.slice(k))), await mth(hashes.slice(0, k))];
}

describe('RFC 9162 inclusion proofs', () => {
  it('reproduces the reference tree: every root of 1 to 8 leaves, from every leaf and its path', async () => {
    const leaves = await Promise.all(CT_LEAVES.map(leafHash));
    for (let size = 1; size <= 8; size += 1) {
      expect(toHex(await mth(leaves.slice(0, size)))).toBe(CT_ROOTS[size - 1]);
      for (let index = 0; index < size; index += 1) {
        const proof = await path(index, leaves.slice(0, size));
        expect(toHex(await rootFromInclusionProof(index, size, leaves[index]!, proof))).toBe(CT_ROOTS[size - 1]);
      }
    }
  });

  it('verifies the published proofs of leaves 0 and 5 in the tree of 8', async () => {
    for (const [index, proof] of CT_PROOFS) {
      const root = await rootFromInclusionProof(index, 8, await leafHash(CT_LEAVES[index]!), proof.map(hex));
      expect(toHex(root)).toBe(CT_ROOTS[7]);
    }
  });

  it('leads elsewhere, or refuses, when the leaf, the index, the size or the proof is wrong', async () => {
    const [index, hexProof] = CT_PROOFS[1]!;
    const proof = hexProof.map(hex);
    const leaf = await leafHash(CT_LEAVES[index]!);
    const root = CT_ROOTS[7];
    expect(toHex(await rootFromInclusionProof(index, 8, await leafHash(CT_LEAVES[4]!), proof))).not.toBe(root);
    expect(toHex(await rootFromInclusionProof(4, 8, leaf, proof))).not.toBe(root);
    const flipped = proof.map((p) => p.slice());
    flipped[1]![0]! ^= 1;
    expect(toHex(await rootFromInclusionProof(index, 8, leaf, flipped))).not.toBe(root);
    await expect(rootFromInclusionProof(index, 8, leaf, proof.slice(0, 2))).rejects.toThrow('too short');
    await expect(rootFromInclusionProof(index, 8, leaf, [...proof, proof[0]!])).rejects.toThrow('too long');
    await expect(rootFromInclusionProof(8, 8, leaf, proof)).rejects.toThrow(LogCheckError);
  });

  it("hashes a leaf as golang.org/x/mod/sumdb/tlog's RecordHash does", async () => {
    expect(toBase64(await leafHash(utf8('hello world')))).toBe('TszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0=');
  });
});

// golang.org/x/mod/sumdb/note's test vectors (note_test.go).
const PETER_KEY = 'PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW';
const ENOCH_KEY = 'EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop';
const TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n";
const PETER_SIG =
  '— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n';
const ENOCH_SIG =
  '— EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n';

describe('C2SP signed notes', () => {
  it('parses a verifier key, checking its key id against the key', async () => {
    const key = await parseVerifierKey(PETER_KEY);
    expect(key.name).toBe('PeterNeumann');
    expect(toHex(key.keyId)).toBe('c74f20a3');
    expect(key.publicKey).toHaveLength(32);
    for (const bad of [
      'PeterNeumann+c74f20a4+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW', // key id of another key
      'PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==', // wrong length
      'PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW', // unknown algorithm
      'PeterNeumann+c74f20a3',
      '+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW',
      'Peter Neumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW',
    ])
      await expect(parseVerifierKey(bad), bad).rejects.toThrow(LogCheckError);
  });

  it("verifies the published note by its key, ignoring another key's signature", async () => {
    const peter = await parseVerifierKey(PETER_KEY);
    const enoch = await parseVerifierKey(ENOCH_KEY);
    const note = `${TEXT}\n${PETER_SIG}${ENOCH_SIG}`;
    expect(await verifyNote(note, peter)).toBe(TEXT);
    expect(await verifyNote(note, enoch)).toBe(TEXT);
    expect(parseNote(note).signatures.map((sig) => sig.name)).toEqual(['PeterNeumann', 'EnochRoot']);
    await expect(verifyNote(`${TEXT}\n${ENOCH_SIG}`, peter)).rejects.toThrow('no signature by PeterNeumann');
  });

  it('refuses the note when its text or signature is changed', async () => {
    const peter = await parseVerifierKey(PETER_KEY);
    await expect(verifyNote(`${TEXT.replace('you', 'we')}\n${PETER_SIG}`, peter)).rejects.toThrow('does not verify');
    const forged = PETER_SIG.replace('x08go/ZJ', 'x08go/ZK');
    await expect(verifyNote(`${TEXT}\n${forged}`, peter)).rejects.toThrow('does not verify');
    await expect(verifyNote(`${TEXT}${PETER_SIG}`, peter)).rejects.toThrow(LogCheckError);
  });
});

describe('C2SP checkpoints', () => {
  it('parses origin, size and root, keeping extension lines', () => {
    const text = 'go.sum database tree\n123456789012\nTszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0=\n';
    const checkpoint = parseCheckpoint(text);
    expect(checkpoint.origin).toBe('go.sum database tree');
    expect(checkpoint.size).toBe(123456789012);
    expect(toBase64(checkpoint.rootHash)).toBe('TszzRgjTG6xce+z2AG31kAXYKBgQVtCSCE40HmuwBb0=');
    expect(parseCheckpoint(`${text}extra\n`).extensions).toEqual(['extra']);
    for (const bad of [
      text.replace('123456789012', '0xabcdef'),
      text.replace('123456789012', '0123'),
      text.replace('BgQVtCSCE40HmuwBb0=', 'BgQVtCSCE40HmuwTOOBIG='),
      text.slice(0, -1),
    ])
      expect(() => parseCheckpoint(bad), bad).toThrow(LogCheckError);
  });
});

describe('a record checked against a signed checkpoint, as the Audit page does', () => {
  const ORIGIN = 'toolgate.test/audit';
  const records = Array.from({ length: 7 }, (_, i) => ({
    seq: i + 1,
    event_id: `evt_${i}`,
    event_type: i % 2 ? 'run.step.completed' : 'run.step.dispatching',
    details: { note: `é ${i}`, nested: { z: 1, a: [true, null] } },
    cost_units: i / 4,
  }));

  async function signedLog() {
    const pair = (await crypto.subtle.generateKey({ name: 'Ed25519' }, true, [
      'sign',
      'verify',
    ])) as webcrypto.CryptoKeyPair;
    const key = Uint8Array.of(1, ...new Uint8Array(await crypto.subtle.exportKey('raw', pair.publicKey)));
    const keyId = new Uint8Array(
      await crypto.subtle.digest('SHA-256', Uint8Array.of(...utf8(`${ORIGIN}\n`), ...key)),
    ).slice(0, 4);
    const verifierKey = `${ORIGIN}+${toHex(keyId)}+${toBase64(key)}`;
    const leaves = await Promise.all(records.map(recordLeafHash));
    const body = `${ORIGIN}\n${leaves.length}\n${toBase64(await mth(leaves))}\n`;
    const signature = new Uint8Array(await crypto.subtle.sign({ name: 'Ed25519' }, pair.privateKey, utf8(body)));
    const note = `${body}\n— ${ORIGIN} ${toBase64(Uint8Array.of(...keyId, ...signature))}\n`;
    const inclusion = async (index: number) => ({
      leaf_index: index,
      tree_size: leaves.length,
      leaf_hash: toBase64(leaves[index]!),
      proof: (await path(index, leaves)).map(toBase64),
    });
    return { verifierKey, note, inclusion };
  }

  it('hashes a record as the JCS canonical JSON of it: keys sorted, no white space', async () => {
    expect(canonicalJson({ b: [1, 'é', { d: null, c: 0.5 }], a: true })).toBe(
      '{"a":true,"b":[1,"é",{"c":0.5,"d":null}]}',
    );
    expect(canonicalJson({ '\u20ac': 1, '\r': 2, a: 3 })).toBe('{"\\r":2,"a":3,"€":1}');
    expect(toBase64(await recordLeafHash({ b: 1, a: 2 }))).toBe(toBase64(await leafHash(utf8('{"a":2,"b":1}'))));
  });

  it('verifies every record of the log here, whatever its key (a key whose base64 holds a +, too)', async () => {
    let log = await signedLog();
    while (!log.verifierKey.split('+').slice(2).join('+').includes('+')) log = await signedLog();
    for (let index = 0; index < records.length; index += 1) {
      const verdict = await verifyRecordInclusion({
        note: log.note,
        verifierKey: log.verifierKey,
        record: records[index],
        inclusion: await log.inclusion(index),
      });
      expect(verdict).toMatchObject({ origin: ORIGIN, treeSize: 7, leafIndex: index });
    }
  });

  it('says which check fails: an edited record, a proof for another leaf, another key, another tree size', async () => {
    const log = await signedLog();
    const other = await signedLog();
    const base = {
      note: log.note,
      verifierKey: log.verifierKey,
      record: records[3],
      inclusion: await log.inclusion(3),
    };
    await expect(verifyRecordInclusion({ ...base, record: { ...records[3], cost_units: 9 } })).rejects.toThrow(
      'does not hash to its leaf',
    );
    const wrongLeaf = { ...(await log.inclusion(2)), leaf_hash: base.inclusion.leaf_hash, leaf_index: 3 };
    await expect(verifyRecordInclusion({ ...base, inclusion: wrongLeaf })).rejects.toThrow("checkpoint's root");
    await expect(verifyRecordInclusion({ ...base, verifierKey: other.verifierKey })).rejects.toThrow(
      'no signature by toolgate.test/audit',
    );
    await expect(verifyRecordInclusion({ ...base, inclusion: { ...base.inclusion, tree_size: 6 } })).rejects.toThrow(
      'tree of 6',
    );
  });
});
