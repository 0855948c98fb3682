import { useState } from 'preact/hooks';
import { attempt, type Schemas } from '../api.js';
import { formValues, Id, Listing, PageFrame, RefusalNote, When } from '../components.js';
import { useAction, usePaged } from '../hooks.js';
import { isPlatform, useSession } from '../session.js';

type Verification = {
  ok: boolean;
  checked: number;
  first_bad_seq: number | null;
  head: { seq: number; hash: string } | null;
};

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
  return (
    <PageFrame title="Audit">
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
        {(items) => <EventTable items={items} />}
      </Listing>
    </PageFrame>
  );
}

function EventTable({ items }: { items: Array<Schemas['AuditEvent']> }) {
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
      <h2 id="verify-title">Hash chain</h2>
      <p>
        {platform
          ? 'Walks the whole chain and reports its state and head. Keep the head outside the database as an anchor.'
          : 'Verifying the chain is for platform-operators; the API will refuse it for you.'}
      </p>
      <button
        type="button"
        disabled={verify.busy}
        onClick={() => void verify.run(() => attempt(client.GET('/audit/verify')))}
      >
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
