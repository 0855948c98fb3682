import { useId } from 'preact/hooks';
import { attempt, type Schemas } from '../api.js';
import { Facts, formValues, Listing, PageFrame, RefusalNote, When } from '../components.js';
import { useAction, usePaged } from '../hooks.js';
import { isPlatform, useSession } from '../session.js';

type KillSwitch = Schemas['KillSwitch'];
type Scope = Schemas['KillSwitchScope'];
/** In blame order, broadest first, as the API lists them. */
const SCOPES: Scope[] = ['global', 'region', 'provider', 'tenant', 'family', 'agent', 'tool'];
const TENANT_SCOPES: Scope[] = ['tenant', 'family', 'agent', 'tool'];

export function KillSwitchesPage() {
  const { client } = useSession();
  const paged = usePaged(
    (cursor) => attempt(client.GET('/kill-switches', { params: { query: { state: 'armed', limit: 50, cursor } } })),
    [],
  );
  return (
    <PageFrame title="Kill switches">
      <p>
        An armed switch refuses every matching call at its next boundary, on every replica, and stops the open runs that
        depend on it. The caller sees the status copy, never the reason.
      </p>
      <h2>Armed</h2>
      <Listing label="Armed switches" paged={paged} empty="No switch is armed.">
        {(items) => <ArmedByScope items={items} onDisarmed={paged.reload} />}
      </Listing>
      <ArmForm onArmed={paged.reload} />
      <DecideForm />
    </PageFrame>
  );
}

function ArmedByScope({ items, onDisarmed }: { items: KillSwitch[]; onDisarmed: () => void }) {
  return (
    <>
      {SCOPES.filter((scope) => items.some((item) => item.scope === scope)).map((scope) => (
        <section key={scope} aria-label={`${scope} switches`}>
          <h3>{scope}</h3>
          <ul class="cards">
            {items
              .filter((item) => item.scope === scope)
              .map((item) => (
                <li key={item.id}>
                  <SwitchCard item={item} onDisarmed={onDisarmed} />
                </li>
              ))}
          </ul>
        </section>
      ))}
    </>
  );
}

function SwitchCard({ item, onDisarmed }: { item: KillSwitch; onDisarmed: () => void }) {
  const { client } = useSession();
  const disarm = useAction<KillSwitch>();
  const id = useId();
  const submit = async (event: Event) => {
    event.preventDefault();
    const { reason = '' } = formValues(event.currentTarget as HTMLFormElement);
    const outcome = await disarm.run(() =>
      attempt(client.POST('/kill-switches/{id}/disarm', { params: { path: { id: item.id } }, body: { reason } })),
    );
    if (outcome.ok) onDisarmed();
  };
  return (
    <article class="card" aria-labelledby={`${id}-title`}>
      <h4 id={`${id}-title`}>
        {item.scope} <code>{item.target}</code> {item.tenant_id ? `in ${item.tenant_id}` : '(platform-wide)'}
      </h4>
      <Facts
        facts={[
          ['Reason', item.reason],
          ['Status copy', item.user_visible_status_copy],
          ['Armed by', <code>{item.armed_by.actor_id}</code>],
          ['Armed', <When at={item.armed_at} />],
          ['Switch', <code>{item.id}</code>],
        ]}
      />
      <form class="inline" onSubmit={submit}>
        <label for={`${id}-reason`}>Reason</label>
        <input id={`${id}-reason`} name="reason" required maxLength={2000} />
        <button type="submit" disabled={disarm.busy}>
          Disarm
        </button>
        <RefusalNote refusal={disarm.refusal} />
      </form>
    </article>
  );
}

function ArmForm({ onArmed }: { onArmed: () => void }) {
  const { client, principal } = useSession();
  const arm = useAction<KillSwitch>();
  const platform = isPlatform(principal);
  const submit = async (event: Event) => {
    event.preventDefault();
    const form = event.currentTarget as HTMLFormElement;
    const values = formValues(form);
    const scope = values.scope as Scope;
    const outcome = await arm.run(() =>
      attempt(
        client.POST('/kill-switches', {
          body: {
            scope,
            ...(values.target ? { target: values.target } : {}),
            // A blank tenant is a platform-wide switch, which only a platform-operator may arm.
            tenant_id: values.tenant_id ?? null,
            reason: values.reason ?? '',
            user_visible_status_copy: values.copy ?? '',
          },
        }),
      ),
    );
    if (outcome.ok) {
      form.reset();
      // Keep the scope just used: the next switch is likely of the same kind.
      (form.elements.namedItem('scope') as HTMLSelectElement).value = scope;
      onArmed();
    }
  };
  return (
    <form class="panel" aria-labelledby="arm-title" onSubmit={submit}>
      <h2 id="arm-title">Arm a switch</h2>
      <div class="grid">
        <label for="arm-scope">Scope</label>
        <select id="arm-scope" name="scope" defaultValue="agent">
          {(platform ? SCOPES : TENANT_SCOPES).map((scope) => (
            <option key={scope} value={scope}>
              {scope}
            </option>
          ))}
        </select>
        <label for="arm-target">Target</label>
        <input id="arm-target" name="target" aria-describedby="arm-target-help" />
        <small id="arm-target-help">
          The agent id, tool id, family, tenant id, provider or region; <code>*</code> or blank for global.
        </small>
        <label for="arm-tenant">Tenant</label>
        <input
          id="arm-tenant"
          name="tenant_id"
          defaultValue={platform ? '' : principal.tenant_id}
          aria-describedby="arm-tenant-help"
        />
        <small id="arm-tenant-help">
          {platform ? 'Blank: platform-wide.' : 'A tenant-operator arms switches in its own tenant only.'}
        </small>
        <label for="arm-reason">Reason</label>
        <input id="arm-reason" name="reason" required maxLength={2000} aria-describedby="arm-reason-help" />
        <small id="arm-reason-help">For the audit log and other operators; callers never see it.</small>
        <label for="arm-copy">Status copy</label>
        <input id="arm-copy" name="copy" required maxLength={1000} aria-describedby="arm-copy-help" />
        <small id="arm-copy-help">What a refused caller is told.</small>
      </div>
      <button type="submit" class="danger" disabled={arm.busy}>
        Arm
      </button>
      <RefusalNote refusal={arm.refusal} />
      {arm.result ? (
        <p role="status">
          Armed <code>{arm.result.id}</code>: {arm.result.scope} <code>{arm.result.target}</code>.
        </p>
      ) : null}
    </form>
  );
}

function DecideForm() {
  const { client, principal } = useSession();
  const decide = useAction<Schemas['KillSwitchDecision']>();
  const submit = async (event: Event) => {
    event.preventDefault();
    const values = formValues(event.currentTarget as HTMLFormElement);
    await decide.run(() => attempt(client.GET('/kill-switches/decide', { params: { query: values } })));
  };
  const decision = decide.result;
  return (
    <form class="panel" aria-labelledby="decide-title" onSubmit={submit}>
      <h2 id="decide-title">What stops this call?</h2>
      <p>Answered from this replica's switches, exactly as the safety stage of a call would decide.</p>
      <div class="grid">
        <label for="decide-tenant">Tenant</label>
        <input id="decide-tenant" name="tenant_id" defaultValue={principal.tenant_id} />
        <label for="decide-agent">Agent</label>
        <input id="decide-agent" name="agent_id" />
        <label for="decide-family">Family</label>
        <input id="decide-family" name="family" />
        <label for="decide-tool">Tool</label>
        <input id="decide-tool" name="tool_id" />
      </div>
      <button type="submit" disabled={decide.busy}>
        Check
      </button>
      <RefusalNote refusal={decide.refusal} />
      {decision ? (
        <div role="status" class="decision">
          {decision.ok ? (
            <p>Nothing stops this call.</p>
          ) : (
            <p>
              Stopped (<code>{decision.code}</code>) by the {decision.blamed?.scope} switch{' '}
              <code>{decision.blamed?.target}</code>: “{decision.blamed?.user_visible_status_copy}”
            </p>
          )}
          {decision.matches.length > 1 ? (
            <p>
              {decision.matches.length} switches match:{' '}
              {decision.matches.map((match) => `${match.scope} ${match.target}`).join(', ')}.
            </p>
          ) : null}
        </div>
      ) : null}
    </form>
  );
}
