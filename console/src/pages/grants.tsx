import { useId, useState } from 'preact/hooks';
import { attempt, type Schemas } from '../api.js';
import { Facts, formValues, Listing, PageFrame, RefusalNote, TtlSelect, When } from '../components.js';
import { useAction, usePaged } from '../hooks.js';
import { isPlatform, useSession } from '../session.js';

type Grant = Schemas['Grant'];
type GrantStatus = Schemas['GrantStatus'];
const SCOPES: Array<Schemas['GrantScope']> = [
  'per-tenant',
  'per-user',
  'per-session',
  'per-pipeline-instance',
  'per-run',
];

const expiresIn = (seconds: string | undefined) => new Date(Date.now() + Number(seconds ?? 86400) * 1000).toISOString();

export function GrantsPage() {
  const { client } = useSession();
  const [filter, setFilter] = useState<{ status?: GrantStatus; agent_id?: string; tool_id?: string }>({
    status: 'live',
  });
  const paged = usePaged(
    (cursor) => attempt(client.GET('/grants', { params: { query: { limit: 25, cursor, ...filter } } })),
    [filter],
  );
  return (
    <PageFrame title="Grants">
      <p>
        A grant gives one agent one tool, in a scope, until it expires, for a stated reason. Revoking acts at the next
        call boundary of every run; renewing mints a new grant and ends the old one.
      </p>
      <CreateGrant onCreated={paged.reload} />
      <ResolveForm />
      <h2>Grants</h2>
      <form
        class="filters"
        aria-label="Filter grants"
        onSubmit={(event) => {
          event.preventDefault();
          setFilter(formValues(event.currentTarget as HTMLFormElement));
        }}
      >
        <label for="grants-status">Status</label>
        <select id="grants-status" name="status" defaultValue="live">
          <option value="live">live</option>
          <option value="expired">expired</option>
          <option value="revoked">revoked</option>
          <option value="">any</option>
        </select>
        <label for="grants-agent">Agent</label>
        <input id="grants-agent" name="agent_id" />
        <label for="grants-tool">Tool</label>
        <input id="grants-tool" name="tool_id" />
        <button type="submit">Filter</button>
      </form>
      <Listing label="Grants" paged={paged} empty="No grants.">
        {(items) => (
          <ul class="cards">
            {items.map((grant) => (
              <li key={grant.id}>
                <GrantCard grant={grant} onChanged={paged.reload} />
              </li>
            ))}
          </ul>
        )}
      </Listing>
    </PageFrame>
  );
}

function CreateGrant({ onCreated }: { onCreated: () => void }) {
  const { client, principal } = useSession();
  const create = useAction<Grant>();
  const submit = async (event: Event) => {
    event.preventDefault();
    const form = event.currentTarget as HTMLFormElement;
    const values = formValues(form);
    const outcome = await create.run(() =>
      attempt(
        client.POST('/grants', {
          body: {
            ...(values.tenant_id ? { tenant_id: values.tenant_id } : {}),
            agent_id: values.agent_id ?? '',
            tool_id: values.tool_id ?? '',
            scope: (values.scope ?? 'per-tenant') as Schemas['GrantScope'],
            ...(values.scope_ref ? { scope_ref: values.scope_ref } : {}),
            expires_at: expiresIn(values.ttl),
            rationale: values.rationale ?? '',
          },
        }),
      ),
    );
    if (outcome.ok) {
      form.reset();
      onCreated();
    }
  };
  return (
    <form class="panel" aria-labelledby="grant-title" onSubmit={submit}>
      <h2 id="grant-title">Grant a tool</h2>
      <div class="grid">
        {isPlatform(principal) ? (
          <>
            <label for="grant-tenant">Tenant</label>
            <input id="grant-tenant" name="tenant_id" placeholder={principal.tenant_id} />
          </>
        ) : null}
        <label for="grant-agent">Agent</label>
        <input id="grant-agent" name="agent_id" required />
        <label for="grant-tool">Tool</label>
        <input id="grant-tool" name="tool_id" required />
        <label for="grant-scope">Grant scope</label>
        <select id="grant-scope" name="scope" defaultValue="per-tenant">
          {SCOPES.map((scope) => (
            <option key={scope} value={scope}>
              {scope}
            </option>
          ))}
        </select>
        <label for="grant-scope-ref">Scope reference</label>
        <input id="grant-scope-ref" name="scope_ref" aria-describedby="grant-scope-ref-help" />
        <small id="grant-scope-ref-help">The run, pipeline instance, session or user id; blank for per-tenant.</small>
        <label for="grant-ttl">TTL</label>
        <TtlSelect id="grant-ttl" />
        <label for="grant-rationale">Rationale</label>
        <input id="grant-rationale" name="rationale" required maxLength={2000} />
      </div>
      <button type="submit" disabled={create.busy}>
        Grant
      </button>
      <RefusalNote refusal={create.refusal} />
      {create.result ? (
        <p role="status">
          Granted <code>{create.result.id}</code>, until <When at={create.result.expires_at} />.
        </p>
      ) : null}
    </form>
  );
}

function ResolveForm() {
  const { client } = useSession();
  const resolve = useAction<Schemas['GrantResolution']>();
  const submit = async (event: Event) => {
    event.preventDefault();
    const values = formValues(event.currentTarget as HTMLFormElement);
    const query = { agent_id: values.agent_id ?? '', tool_id: values.tool_id ?? '', ...values };
    await resolve.run(() => attempt(client.GET('/grants/resolve', { params: { query } })));
  };
  const result = resolve.result;
  return (
    <form class="panel" aria-labelledby="resolve-title" onSubmit={submit}>
      <h2 id="resolve-title">Why can't an agent call a tool?</h2>
      <p>The grant resolution every call's admission runs, with every candidate it considered.</p>
      <div class="grid">
        <label for="resolve-agent">Agent</label>
        <input id="resolve-agent" name="agent_id" required />
        <label for="resolve-tool">Tool</label>
        <input id="resolve-tool" name="tool_id" required />
        <label for="resolve-run">Run id</label>
        <input id="resolve-run" name="run_id" />
        <label for="resolve-session">Session id</label>
        <input id="resolve-session" name="session_id" />
        <label for="resolve-user">User id</label>
        <input id="resolve-user" name="user_id" />
      </div>
      <button type="submit" disabled={resolve.busy}>
        Explain
      </button>
      <RefusalNote refusal={resolve.refusal} />
      {result ? (
        <div role="status" class="decision">
          {result.ok && result.grant ? (
            <p>
              Allowed by <code>{result.grant.id}</code> ({result.grant.scope} {result.grant.scope_ref}), until{' '}
              <When at={result.grant.expires_at} />.
            </p>
          ) : (
            <p>
              Refused: <code>{result.code}</code>.
            </p>
          )}
          {result.candidates.length > 0 ? (
            <ul>
              {result.candidates.map((candidate) => (
                <li key={candidate.grant.id}>
                  <code>{candidate.grant.id}</code> {candidate.grant.scope} {candidate.grant.scope_ref}:{' '}
                  {candidate.status}, priority {candidate.priority}
                  {candidate.selected ? ' (selected)' : ''}
                </li>
              ))}
            </ul>
          ) : (
            <p>No grant matches this agent, tool and context.</p>
          )}
        </div>
      ) : null}
    </form>
  );
}

function GrantCard({ grant: initial, onChanged }: { grant: Grant; onChanged: () => void }) {
  const { client } = useSession();
  const [grant, setGrant] = useState(initial);
  const revoke = useAction<Grant>();
  const renew = useAction<Grant>();
  const id = useId();
  const onRevoke = async (event: Event) => {
    event.preventDefault();
    const { reason = '' } = formValues(event.currentTarget as HTMLFormElement);
    const outcome = await revoke.run(() =>
      attempt(client.POST('/grants/{id}/revoke', { params: { path: { id: grant.id } }, body: { reason } })),
    );
    if (outcome.ok) setGrant(outcome.data);
  };
  const onRenew = async (event: Event) => {
    event.preventDefault();
    const values = formValues(event.currentTarget as HTMLFormElement);
    const outcome = await renew.run(() =>
      attempt(
        client.POST('/grants/{id}/renew', {
          params: { path: { id: grant.id } },
          body: { rationale: values.rationale ?? '', expires_at: expiresIn(values.ttl) },
        }),
      ),
    );
    if (outcome.ok) onChanged();
  };
  return (
    <article class="card" aria-labelledby={`${id}-title`}>
      <h3 id={`${id}-title`}>
        <code>{grant.agent_id}</code> → <code>{grant.tool_id}</code>{' '}
        <span class={`badge ${grant.status}`}>{grant.status}</span>
      </h3>
      <Facts
        facts={[
          ['Scope', `${grant.scope} ${grant.scope_ref}`],
          ['Expires', <When at={grant.expires_at} />],
          ['Rationale', grant.rationale],
          ['Granted by', <code>{grant.granted_by.actor_id}</code>],
          ['Granted', <When at={grant.granted_at} />],
          ['Grant', <code>{grant.id}</code>],
          ...(grant.revoked_at
            ? ([
                ['Revoked', <When at={grant.revoked_at} />],
                ['Revocation reason', grant.revocation_reason],
              ] as Array<[string, preact.ComponentChildren]>)
            : []),
        ]}
      />
      {grant.status === 'live' ? (
        <div class="actions">
          <form class="inline" onSubmit={onRevoke}>
            <label for={`${id}-reason`}>Reason</label>
            <input id={`${id}-reason`} name="reason" required maxLength={2000} />
            <button type="submit" class="danger" disabled={revoke.busy}>
              Revoke
            </button>
            <RefusalNote refusal={revoke.refusal} />
          </form>
          <form class="inline" onSubmit={onRenew}>
            <label for={`${id}-ttl`}>Renew for</label>
            <TtlSelect id={`${id}-ttl`} />
            <label for={`${id}-rationale`}>Rationale</label>
            <input id={`${id}-rationale`} name="rationale" required maxLength={2000} />
            <button type="submit" disabled={renew.busy}>
              Renew
            </button>
            <RefusalNote refusal={renew.refusal} />
          </form>
        </div>
      ) : null}
      {revoke.result ? <p role="status">Revoked.</p> : null}
    </article>
  );
}
