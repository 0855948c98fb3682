import { canonicalJson } from '../../audit/audit-hash.js';
import { leafHash, verifyConsistency, verifyInclusion } from '../../audit/merkle.js';
import { openNote, parseCheckpoint } from '../../audit/signed-note.js';
import { command } from './help.js';
import { keep, readKept } from './kept.js';
import { CheckFailed, Session, UsageError } from './session.js';

/** `audit witness` and `audit prove`: the log's Merkle tree checked from outside the gateway (SPEC §8.1). */
export function treeCommands(): ReturnType<typeof command>[] {
  return [
    command(
      'witness',
      "check the log's latest signed checkpoint and that the log only grew since the one kept in FILE, then keep it",
      'toolgate audit witness --state witness.json',
    )
      .requiredOption('--state <file>', 'where the last checkpoint checked is kept (created on the first run)')
      .option('--log-key <key>', "the log's note verifier key (default: the one kept in FILE, else the gateway's)")
      .action(async (options: { state: string; logKey?: string }, cmd) => {
        const s = new Session(cmd);
        const kept = await readWitnessState(options.state);
        const info = await s.call(s.api.GET('/audit/log-info', {}));
        const key = options.logKey ?? kept?.verifier_key ?? info.verifier_key;
        const head = await signedHead(s, key, info.origin);
        if (kept !== undefined) {
          if (head.size < kept.size)
            throw new CheckFailed(`the log shrank: checkpoint of ${head.size} leaves after one of ${kept.size}`);
          const proof = await s.call(
            s.api.GET('/audit/consistency', { params: { query: { first: kept.size, second: head.size } } }),
          );
          const ok = verifyConsistency(
            kept.size,
            head.size,
            Buffer.from(kept.root, 'base64'),
            head.root,
            proof.proof.map((h) => Buffer.from(h, 'base64')),
          );
          if (!ok)
            throw new CheckFailed(`the log's tree of ${head.size} leaves does not extend the kept one of ${kept.size}`);
        }
        const state: WitnessState = {
          verifier_key: key,
          size: head.size,
          root: head.root.toString('base64'),
          note: head.note,
        };
        await keep(options.state, state);
        s.print(
          { ok: true, tree_size: head.size, root: state.root, previous_tree_size: kept?.size ?? null },
          () =>
            `checkpoint of ${head.size} leaves verified${kept === undefined ? ' and kept' : `, consistent with the kept one of ${kept.size}`}`,
        );
      }),
    command(
      'prove',
      'check here that a record is in the log: its leaf, its inclusion proof and the signed checkpoint',
      'toolgate audit prove 0b6f…-event-id',
    )
      .argument('<event-id>')
      .option('--log-key <key>', "the log's note verifier key (default: the gateway's)")
      .action(async (eventId: string, options: { logKey?: string }, cmd) => {
        const s = new Session(cmd);
        const info = await s.call(s.api.GET('/audit/log-info', {}));
        const head = await signedHead(s, options.logKey ?? info.verifier_key, info.origin);
        const event = await s.call(s.api.GET('/audit/events/{event_id}', { params: { path: { event_id: eventId } } }));
        const leaf = leafHash(canonicalJson(event.record) ?? '{}');
        if (event.leaf_hash === null) throw new CheckFailed(`record ${eventId} is not sequenced yet`);
        if (leaf.toString('base64') !== event.leaf_hash)
          throw new CheckFailed(`record ${eventId} does not hash to its leaf: it was changed after it was logged`);
        const inclusion = await s.call(
          s.api.GET('/audit/events/{event_id}/inclusion', {
            params: { path: { event_id: eventId }, query: { tree_size: head.size } },
          }),
        );
        const proof = inclusion.proof.map((h) => Buffer.from(h, 'base64'));
        if (!verifyInclusion(inclusion.leaf_index, head.size, leaf, proof, head.root))
          throw new CheckFailed(`record ${eventId}'s inclusion proof does not lead to the signed root`);
        s.print(
          { ok: true, event_id: eventId, leaf_index: inclusion.leaf_index, tree_size: head.size },
          () => `record ${eventId} is leaf ${inclusion.leaf_index} of the signed tree of ${head.size} leaves`,
        );
      }),
  ];
}

/** What `audit witness` keeps between runs: the log's key and the last checkpoint it checked. */
interface WitnessState {
  verifier_key: string;
  size: number;
  root: string;
  note: string;
}

async function readWitnessState(file: string): Promise<WitnessState | undefined> {
  const state = (await readKept(file)) as Partial<WitnessState> | undefined;
  if (state === undefined) return undefined;
  if (typeof state.verifier_key !== 'string' || !Number.isSafeInteger(state.size) || typeof state.root !== 'string')
    throw new UsageError(`${file} is not a state kept by toolgate audit witness`);
  return state as WitnessState;
}

/** The latest checkpoint, its signature checked here against `key` and its origin against the log's. */
async function signedHead(
  s: Session,
  key: string,
  origin: string,
): Promise<{ size: number; root: Buffer; note: string }> {
  const note = await s.call(s.api.GET('/audit/checkpoint', { parseAs: 'text' }));
  const text = openNote(note, key);
  const head = text === undefined ? undefined : parseCheckpoint(text);
  if (head === undefined) throw new CheckFailed("the log's checkpoint is not signed by its key");
  if (head.origin !== origin) throw new CheckFailed(`the checkpoint names origin ${head.origin}, not ${origin}`);
  return { size: head.size, root: head.root, note };
}
