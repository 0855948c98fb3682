import { useEffect, useId, useRef, useState } from 'preact/hooks';
import { attempt, type Schemas, type ToolgateClient } from '../api.js';
import { Facts, formValues, Listing, NewMark, PageFrame, RefusalNote, When } from '../components.js';
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
    { key: (item) => item.id, live: true },
  );
  return (
    <PageFrame title="Kill switches">
      <p>
        An armed switch refuses every matching call at its next boundary, on every replica, and stops the open runs that
        depend on it. The caller sees the status copy, never the reason.
      </p>
      <h2>Armed</h2>
      <Listing label="Armed switches" paged={paged} empty="No switch is armed.">
        {(items) => <ArmedByScope items={items} fresh={paged.fresh} onDisarmed={paged.reload} />}
      </Listing>
      <ArmForm onArmed={paged.reload} />
      <DecideForm />
    </PageFrame>
  );
}

function ArmedByScope({
  items,
  fresh,
  onDisarmed,
}: {
  items: KillSwitch[];
  fresh: ReadonlySet<string>;
  onDisarmed: () => void;
}) {
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
                  <SwitchCard item={item} fresh={fresh.has(item.id)} onDisarmed={onDisarmed} />
                </li>
              ))}
          </ul>
        </section>
      ))}
    </>
  );
}

function SwitchCard({ item, fresh, onDisarmed }: { item: KillSwitch; fresh: boolean; onDisarmed: () => void }) {
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
        {item.scope} <code>{item.target}</code> {item.tenant_id ? `in ${item.tenant_id}` : '(platform-wide)'}{' '}
        <NewMark show={fresh} />
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

interface ArmRequest {
  scope: Scope;
  target: string;
  tenant_id: string | null;
  reason: string;
  user_visible_status_copy: string;
}

/** What a switch stops, in words an operator confirms. */
export function whatStops({ scope, target, tenant_id }: Pick<ArmRequest, 'scope' | 'target' | 'tenant_id'>): string {
  const where = tenant_id ? ` in tenant ${tenant_id}` : ', in every tenant';
  switch (scope) {
    case 'global':
      return 'every call of every tenant';
    case 'region':
      return `every call to a tool in region ${target}, in every tenant`;
    case 'provider':
      return `every call to a tool of provider ${target}, in every tenant`;
    case 'tenant':
      return `every call of tenant ${target}`;
    case 'family':
      return `every call of an agent, or to a tool, of family ${target}${where}`;
    case 'agent':
      return `every call of agent ${target}${where}`;
    case 'tool':
      return `every call to tool ${target}${where}`;
  }
}

/** A switch that reaches past one agent or tool of one tenant is armed only after a confirmation. */
const needsConfirmation = (request: ArmRequest) =>
  request.tenant_id === null || ['global', 'region', 'provider', 'tenant'].includes(request.scope);

function ArmForm({ onArmed }: { onArmed: () => void }) {
  const { client, principal } = useSession();
  const arm = useAction<KillSwitch>();
  const platform = isPlatform(principal);
  const [problem, setProblem] = useState<string | null>(null);
  // Held here, not left to the form: a reset would otherwise select the first scope, `global`.
  const [scope, setScope] = useState<Scope | ''>('');
  const [confirming, setConfirming] = useState<{ request: ArmRequest; form: HTMLFormElement } | null>(null);

  const send = async (request: ArmRequest, form: HTMLFormElement) => {
    const outcome = await arm.run(() => attempt(client.POST('/kill-switches', { body: request })));
    if (outcome.ok) {
      form.reset();
      setScope('');
      onArmed();
    }
  };
  const submit = (event: Event) => {
    event.preventDefault();
    const form = event.currentTarget as HTMLFormElement;
    const values = formValues(form);
    const request: ArmRequest = {
      scope: values.scope as Scope,
      target: values.target ?? '',
      // A blank tenant is a platform-wide switch, which only a platform-operator may arm.
      tenant_id: values.tenant_id ?? null,
      reason: values.reason ?? '',
      user_visible_status_copy: values.copy ?? '',
    };
    // A blank target once meant global: now global is only ever typed out.
    if (request.scope === 'global' && request.target !== '*') {
      setProblem('A global switch stops every call of every tenant: type * as its target to arm one.');
      return;
    }
    if (request.scope !== 'global' && request.target === '*') {
      setProblem(`* is a global switch's target; a ${request.scope} switch names one ${request.scope}.`);
      return;
    }
    setProblem(null);
    if (needsConfirmation(request)) setConfirming({ request, form });
    else void send(request, form);
  };
  return (
    <form class="panel" aria-labelledby="arm-title" onSubmit={submit}>
      <h2 id="arm-title">Arm a switch</h2>
      <div class="grid">
        <label for="arm-scope">Scope</label>
        <select
          id="arm-scope"
          name="scope"
          required
          value={scope}
          onChange={(event) => setScope((event.currentTarget as HTMLSelectElement).value as Scope | '')}
        >
          <option value="" disabled>
            Choose a scope
          </option>
          {(platform ? SCOPES : TENANT_SCOPES).map((scope) => (
            <option key={scope} value={scope}>
              {scope}
            </option>
          ))}
        </select>
        <label for="arm-target">Target</label>
        <input id="arm-target" name="target" required aria-describedby="arm-target-help" />
        <small id="arm-target-help">
          The agent id, tool id, family, tenant id, provider or region
          {platform ? (
            <>
              ; for global, type <code>*</code>
            </>
          ) : null}
          .
        </small>
        <label for="arm-tenant">Tenant</label>
        <input
          id="arm-tenant"
          name="tenant_id"
          defaultValue={platform ? '' : principal.tenant_id}
          aria-describedby="arm-tenant-help"
        />
        <small id="arm-tenant-help">
          {platform
            ? 'Blank: platform-wide, in every tenant (you will be asked to confirm).'
            : 'A tenant-operator arms switches in its own tenant only.'}
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
      {problem ? (
        <p class="refusal" role="alert">
          {problem}
        </p>
      ) : null}
      <RefusalNote refusal={arm.refusal} />
      {arm.result ? (
        <p role="status">
          Armed <code>{arm.result.id}</code>: {arm.result.scope} <code>{arm.result.target}</code>.
        </p>
      ) : null}
      {confirming ? (
        <ConfirmArm
          request={confirming.request}
          onCancel={() => setConfirming(null)}
          onConfirm={() => {
            const { request, form } = confirming;
            setConfirming(null);
            void send(request, form);
          }}
        />
      ) : null}
    </form>
  );
}

/** What arming would end, as far as the listing routes can tell before it is armed. */
interface Impact {
  runs: number;
  approvals: number;
  /** More than one page of either: the counts are lower bounds. */
  atLeast: boolean;
}

const OPEN: Array<Schemas['RunStatus']> = ['queued', 'running', 'paused', 'awaiting_approval', 'throttled'];

/**
 * Counts the open runs and pending approvals a global, tenant or agent switch would end, from
 * `GET /runs` and `GET /approvals`. Other scopes depend on each run's tool versions in the registry,
 * which no route answers before arming: null.
 */
export async function impactOf(client: ToolgateClient, request: ArmRequest): Promise<Impact | null> {
  const tenant =
    request.scope === 'tenant'
      ? request.target
      : request.scope === 'agent'
        ? (request.tenant_id ?? undefined)
        : undefined;
  if (!['global', 'tenant', 'agent'].includes(request.scope)) return null;
  const agent = request.scope === 'agent' ? request.target : undefined;
  const runPages = await Promise.all(
    OPEN.map((status) =>
      attempt(
        client.GET('/runs', {
          params: {
            query: {
              status,
              limit: 200,
              ...(tenant ? { tenant_id: tenant } : {}),
              ...(agent ? { agent_id: agent } : {}),
            },
          },
        }),
      ),
    ),
  );
  const approvals = await attempt(
    client.GET('/approvals', {
      params: { query: { status: 'pending', limit: 200, ...(tenant ? { tenant_id: tenant } : {}) } },
    }),
  );
  if (!approvals.ok || runPages.some((outcome) => !outcome.ok)) return null;
  let runs = 0;
  let atLeast = approvals.data.next_cursor !== null;
  for (const outcome of runPages)
    if (outcome.ok) {
      runs += outcome.data.items.length;
      atLeast ||= outcome.data.next_cursor !== null;
    }
  const pending = approvals.data.items.filter((approval) => agent === undefined || approval.agent_id === agent);
  return { runs, approvals: pending.length, atLeast };
}

function ConfirmArm({
  request,
  onCancel,
  onConfirm,
}: {
  request: ArmRequest;
  onCancel: () => void;
  onConfirm: () => void;
}) {
  const { client } = useSession();
  const dialog = useRef<HTMLDialogElement>(null);
  const [impact, setImpact] = useState<Impact | null | 'counting'>('counting');
  useEffect(() => {
    dialog.current?.showModal();
    void impactOf(client, request).then(setImpact);
  }, []);
  const stops = whatStops(request);
  const plural = (n: number, one: string, many: string) => `${n} ${n === 1 ? one : many}`;
  return (
    <dialog
      ref={dialog}
      class="confirm"
      aria-labelledby="confirm-title"
      aria-describedby="confirm-stops"
      onClose={onCancel}
    >
      <h2 id="confirm-title">
        Arm a {request.tenant_id === null && request.scope !== 'global' ? 'platform-wide ' : ''}
        {request.scope} switch?
      </h2>
      <p id="confirm-stops">
        It stops <strong>{stops}</strong>, on every replica, at the next call boundary, until it is disarmed.
      </p>
      <p role="status">
        {impact === 'counting'
          ? 'Counting what it would end…'
          : impact === null
            ? `The console cannot count what a ${request.scope} switch ends before it is armed: the open runs it stops are cancelled, with their pending approvals.`
            : `It ends ${impact.atLeast ? 'at least ' : ''}${plural(impact.runs, 'open run', 'open runs')} and ${plural(impact.approvals, 'pending approval', 'pending approvals')}.`}
      </p>
      <div class="buttons">
        <button type="button" class="quiet" autoFocus onClick={() => dialog.current?.close()}>
          Cancel
        </button>
        <button type="button" class="danger" onClick={onConfirm}>
          Arm: stop {stops}
        </button>
      </div>
    </dialog>
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
