import { useCallback, useEffect, useState } from 'preact/hooks';
import { attempt, getText, type Outcome, type Schemas } from '../api.js';
import { formValues, Id, Listing, PageFrame, RefusalNote, When } from '../components.js';
import { useAction, usePaged } from '../hooks.js';
import { isPlatform, useSession } from '../session.js';
import {
  LogCheckError,
  parseCheckpoint,
  parseVerifierKey,
  toBase64,
  verifyNote,
  verifyRecordInclusion,
} from '../tlog.js';

type Verification = {
  ok: boolean;
  checked: number;
  first_bad_seq: number | null;
  head: { seq: number; hash: string } | null;
  tree?: {
    ok: boolean;
    tree_size: number;
    checked: number;
    first_bad_leaf_index: number | null;
    reason: string | null;
  };
};

/** The chain's verification with the tree's beside it: what `GET /audit/verify` answers without `from_tree_size`. */
async function verifyLog(client: ReturnType<typeof useSession>['client']): Promise<Outcome<Verification>> {
  const outcome = await attempt(client.GET('/audit/verify'));
  if (!outcome.ok || 'head' in outcome.data) return outcome as Outcome<Verification>;
  return {
    ok: false,
    refusal: { status: 0, code: 'internal', message: 'the gateway answered a tree-only verification' },
  };
}

/** Event types an operator most often looks for; the field takes any. */
const COMMON_TYPES = [
  'run.step.dispatching',
  'run.step.completed',
  'run.step.denied',
  'approval.requested',
  'approval.approved',
  'approval.rejected',
  'grant.created',
  'grant.revoked',
  'kill_switch.armed',
  'kill_switch.disarmed',
  'security.cross_tenant_attempt',
  'security.self_approval_attempt',
];

export function AuditPage() {
  const { client, principal } = useSession();
  const [filter, setFilter] = useState<Record<string, string>>({});
  const paged = usePaged(
    (cursor) => attempt(client.GET('/audit', { params: { query: { limit: 50, cursor, ...filter } } })),
    [filter],
  );
  const log = useLog();
  return (
    <PageFrame title="Audit">
      <LogPanel log={log} />
      <Verify platform={isPlatform(principal)} />
      <h2>Latest events</h2>
      <form
        class="filters"
        aria-label="Filter events"
        onSubmit={(event) => {
          event.preventDefault();
          setFilter(formValues(event.currentTarget as HTMLFormElement));
        }}
      >
        <label for="audit-type">Event type</label>
        <input id="audit-type" name="event_type" list="audit-types" />
        <datalist id="audit-types">
          {COMMON_TYPES.map((type) => (
            <option key={type} value={type} />
          ))}
        </datalist>
        <label for="audit-agent">Agent</label>
        <input id="audit-agent" name="agent_id" />
        <label for="audit-run">Run id</label>
        <input id="audit-run" name="run_id" />
        <button type="submit">Filter</button>
      </form>
      <Listing label="Events" paged={paged} empty="No events.">
        {(items) => <EventTable items={items} log={log} />}
      </Listing>
    </PageFrame>
  );
}

function EventTable({ items, log }: { items: Array<Schemas['AuditEvent']>; log: Log }) {
  return (
    <div class="table-wrap" tabIndex={0} role="region" aria-label="Events table">
      <table class="events">
        <caption class="visually-hidden">Audit events, newest first</caption>
        <thead>
          <tr>
            <th scope="col">Seq</th>
            <th scope="col">When</th>
            <th scope="col">Event</th>
            <th scope="col">Actor</th>
            <th scope="col" class="secondary">
              Agent
            </th>
            <th scope="col">Run</th>
            <th scope="col" class="secondary">
              Tool
            </th>
            <th scope="col">Status</th>
            <th scope="col">Reason code</th>
            {log.state === 'ready' ? <th scope="col">In the log</th> : null}
          </tr>
        </thead>
        <tbody>
          {items.map((event) => (
            <tr key={event.event_id}>
              <td>{event.seq}</td>
              <td>
                <When at={event.occurred_at} />
              </td>
              <th scope="row">
                <Id value={event.event_type} />
              </th>
              <td>
                <Id value={event.actor} />
              </td>
              <td class="secondary">{event.agent_id ? <Id value={event.agent_id} /> : '—'}</td>
              <td>{event.run_id ? <Id value={event.run_id} /> : '—'}</td>
              <td class="secondary">
                {event.tool_id ? <Id value={`${event.tool_id} ${event.tool_version ?? ''}`.trim()} /> : '—'}
              </td>
              <td>{event.status ?? '—'}</td>
              <td>{event.reason_code ? <Id value={event.reason_code} /> : '—'}</td>
              {log.state === 'ready' ? (
                <td>
                  <CheckInclusion eventId={event.event_id} log={log} />
                </td>
              ) : null}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

function Verify({ platform }: { platform: boolean }) {
  const { client } = useSession();
  const verify = useAction<Verification>();
  const result = verify.result;
  return (
    <section class="panel" aria-labelledby="verify-title">
      <h2 id="verify-title">Verification</h2>
      <p>
        {platform
          ? 'Walks the hash chain up to where it closed and recomputes every leaf of the Merkle tree from the records. A log kept as leaves only has no chain head: keep its signed checkpoint outside the database instead (toolgate audit witness).'
          : 'Verifying the log is for platform-operators; the API will refuse it for you.'}
      </p>
      <button type="button" disabled={verify.busy} onClick={() => void verify.run(() => verifyLog(client))}>
        Verify
      </button>
      <RefusalNote refusal={verify.refusal} />
      {result ? (
        <div role="status" class="decision">
          <p>
            Chain state: <strong class={result.ok ? 'good' : 'bad'}>{result.ok ? 'ok' : 'broken'}</strong>,{' '}
            {result.checked} rows checked
            {result.first_bad_seq !== null ? `; first bad seq ${result.first_bad_seq}` : ''}.
          </p>
          {result.tree ? (
            <p>
              Merkle tree: <strong class={result.tree.ok ? 'good' : 'bad'}>{result.tree.ok ? 'ok' : 'broken'}</strong>,{' '}
              {result.tree.checked} of {result.tree.tree_size} leaves checked
              {result.tree.first_bad_leaf_index !== null
                ? `; first bad leaf ${result.tree.first_bad_leaf_index} (${result.tree.reason})`
                : result.tree.reason
                  ? ` (${result.tree.reason})`
                  : ''}
              .
            </p>
          ) : null}
          {result.head ? (
            <p>
              Head: seq {result.head.seq}, hash <code class="hash">{result.head.hash}</code>
            </p>
          ) : null}
        </div>
      ) : null}
    </section>
  );
}

/** The latest signed checkpoint, its signature checked here against the log's verifier key. */
interface Trusted {
  verifierKey: string;
  note: string;
  origin: string;
  size: number;
  root: string;
}

type Log =
  | { state: 'loading' }
  | { state: 'absent' }
  | { state: 'failed'; message: string }
  | { state: 'ready'; checkpoint: Trusted; latest: () => Promise<Trusted> };

async function latestCheckpoint(verifierKey: string): Promise<Trusted> {
  const answer = await getText('/audit/checkpoint');
  if (answer.status !== 200) throw new LogCheckError(`GET /audit/checkpoint answered ${answer.status}`);
  const checkpoint = parseCheckpoint(await verifyNote(answer.text, await parseVerifierKey(verifierKey)));
  return {
    verifierKey,
    note: answer.text,
    origin: checkpoint.origin,
    size: checkpoint.size,
    root: toBase64(checkpoint.rootHash),
  };
}

/**
 * The verifiable log (SPEC §8.1), where the gateway has it: a gateway without its routes answers
 * 404, and the page shows the hash chain's Verify alone.
 */
function useLog(): Log {
  const [log, setLog] = useState<Log>({ state: 'loading' });
  const start = useCallback(async () => {
    const info = await getText('/audit/log-info');
    if (info.status === 404) return setLog({ state: 'absent' });
    if (info.status !== 200) return setLog({ state: 'failed', message: `GET /audit/log-info answered ${info.status}` });
    try {
      const { verifier_key: verifierKey } = JSON.parse(info.text) as { verifier_key: string };
      const latest = () => latestCheckpoint(verifierKey);
      setLog({ state: 'ready', checkpoint: await latest(), latest });
    } catch (error) {
      setLog({ state: 'failed', message: (error as Error).message });
    }
  }, []);
  useEffect(() => void start(), [start]);
  return log;
}

function LogPanel({ log }: { log: Log }) {
  if (log.state === 'loading' || log.state === 'absent') return null;
  return (
    <section class="panel" aria-labelledby="log-title">
      <h2 id="log-title">Signed checkpoint</h2>
      {log.state === 'failed' ? (
        <p class="refusal" role="alert">
          The latest checkpoint could not be checked here: {log.message}
        </p>
      ) : (
        <>
          <p role="status">
            <strong class="good">Signature verified here</strong> against the log's key{' '}
            <code>{log.checkpoint.origin}</code>: tree size {log.checkpoint.size}, root{' '}
            <code class="hash">{log.checkpoint.root}</code>.
          </p>
          <p class="muted">
            "Check" on an event fetches its inclusion proof and recomputes, in this browser, its leaf from the record
            and the root from the proof.
          </p>
        </>
      )}
    </section>
  );
}

type Checked =
  | { state: 'idle' | 'checking' }
  | { state: 'verified'; size: number; index: number }
  | { state: 'failed'; message: string };

/** One record checked against the latest checkpoint: its leaf recomputed, its proof followed to the signed root. */
async function checkRecord(eventId: string, log: Extract<Log, { state: 'ready' }>): Promise<Checked> {
  const id = encodeURIComponent(eventId);
  const entry = await getText(`/audit/events/${id}`);
  if (entry.status !== 200) return { state: 'failed', message: `GET /audit/events answered ${entry.status}` };
  const { record, leaf_index: leafIndex } = JSON.parse(entry.text) as { record: unknown; leaf_index: number | null };
  if (leafIndex === null) return { state: 'failed', message: 'not in the log yet: try again in a moment' };
  // A record sequenced after the checkpoint shown is proved against a newer one.
  const checkpoint = leafIndex < log.checkpoint.size ? log.checkpoint : await log.latest();
  const proof = await getText(`/audit/events/${id}/inclusion?tree_size=${checkpoint.size}`);
  if (proof.status !== 200) return { state: 'failed', message: `the inclusion proof answered ${proof.status}` };
  const verdict = await verifyRecordInclusion({
    note: checkpoint.note,
    verifierKey: checkpoint.verifierKey,
    record,
    inclusion: JSON.parse(proof.text),
  });
  return { state: 'verified', size: verdict.treeSize, index: verdict.leafIndex };
}

function CheckInclusion({ eventId, log }: { eventId: string; log: Extract<Log, { state: 'ready' }> }) {
  const [checked, setChecked] = useState<Checked>({ state: 'idle' });
  const check = async () => {
    setChecked({ state: 'checking' });
    setChecked(
      await checkRecord(eventId, log).catch((error: Error) => ({ state: 'failed', message: error.message }) as const),
    );
  };
  if (checked.state === 'verified')
    return (
      <span class="good" role="status" title={`leaf ${checked.index} of the signed tree of ${checked.size}`}>
        verified here
      </span>
    );
  return (
    <>
      <button
        type="button"
        class="quiet"
        onClick={() => void check()}
        disabled={checked.state === 'checking'}
        aria-label={`Check event ${eventId} in the log`}
      >
        Check
      </button>
      {checked.state === 'failed' ? (
        <span class="bad" role="alert">
          {' '}
          {checked.message}
        </span>
      ) : null}
    </>
  );
}
