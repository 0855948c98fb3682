import { useEffect, useState } from 'preact/hooks';
import { attempt, type Schemas } from '../api.js';
import { Facts, formValues, Listing, PageFrame, RefusalNote, When } from '../components.js';
import { useAction, useHash, usePaged } from '../hooks.js';
import { isPlatform, useSession } from '../session.js';

type Run = Schemas['Run'];
type RunStatus = Schemas['RunStatus'];
const STATUSES: RunStatus[] = [
  'queued',
  'running',
  'paused',
  'awaiting_approval',
  'throttled',
  'completed',
  'failed',
  'cancelled',
  'killed',
];
const ENDED: RunStatus[] = ['completed', 'failed', 'cancelled', 'killed'];

interface Filter {
  status?: RunStatus;
  agent_id?: string;
  tenant_id?: string;
}

/** The run a link asked to open (`#/runs?run=<id>`). */
function linkedRun(hash: string): string | null {
  return new URLSearchParams(hash.split('?')[1] ?? '').get('run');
}

export function RunsPage() {
  const { client, principal } = useSession();
  const [filter, setFilter] = useState<Filter>({});
  const [open, setOpen] = useState<{ run_id: string; tenant_id: string } | null>(null);
  // A link to a run opens it, also when followed while this page is already showing.
  const hash = useHash();
  useEffect(() => {
    const run = linkedRun(hash);
    if (run) setOpen({ run_id: run, tenant_id: principal.tenant_id });
  }, [hash, principal.tenant_id]);
  const paged = usePaged(
    (cursor) => attempt(client.GET('/runs', { params: { query: { limit: 25, cursor, ...filter } } })),
    [filter],
  );
  const applyFilter = (event: Event) => {
    event.preventDefault();
    setFilter(formValues(event.currentTarget as HTMLFormElement) as Filter);
  };
  return (
    <PageFrame title="Runs">
      <form class="filters" aria-label="Filter runs" onSubmit={applyFilter}>
        <label for="runs-status">Status</label>
        <select id="runs-status" name="status" defaultValue="">
          <option value="">any</option>
          {STATUSES.map((status) => (
            <option key={status} value={status}>
              {status}
            </option>
          ))}
        </select>
        <label for="runs-agent">Agent</label>
        <input id="runs-agent" name="agent_id" />
        {isPlatform(principal) ? (
          <>
            <label for="runs-tenant">Tenant</label>
            <input id="runs-tenant" name="tenant_id" />
          </>
        ) : null}
        <button type="submit">Filter</button>
      </form>
      <Listing label="Runs" paged={paged} empty="No runs.">
        {(items) => (
          <div class="table-wrap" tabIndex={0} role="region" aria-label="Runs table">
            <table>
              <caption class="visually-hidden">Recent runs, newest first</caption>
              <thead>
                <tr>
                  <th scope="col">Run</th>
                  <th scope="col">Agent</th>
                  <th scope="col">Tenant</th>
                  <th scope="col">Status</th>
                  <th scope="col">Steps</th>
                  <th scope="col">Started</th>
                  <th scope="col">Updated</th>
                </tr>
              </thead>
              <tbody>
                {items.map((run) => (
                  <tr key={`${run.tenant_id}/${run.run_id}`}>
                    <th scope="row">
                      <button
                        type="button"
                        class="link"
                        aria-expanded={open?.run_id === run.run_id && open.tenant_id === run.tenant_id}
                        onClick={() => setOpen({ run_id: run.run_id, tenant_id: run.tenant_id })}
                      >
                        {run.run_id}
                      </button>
                    </th>
                    <td>{run.agent_id}</td>
                    <td>{run.tenant_id}</td>
                    <td>
                      <span class={`badge ${run.status}`}>{run.status}</span>
                    </td>
                    <td>{run.steps.length}</td>
                    <td>
                      <When at={run.created_at} />
                    </td>
                    <td>
                      <When at={run.updated_at} />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        )}
      </Listing>
      {open ? <RunDetail key={`${open.tenant_id}/${open.run_id}`} which={open} onChanged={paged.reload} /> : null}
    </PageFrame>
  );
}

type Control = 'cancel' | 'kill' | 'pause' | 'resume';

/** Which controls the API may allow for a run in this status (it decides; refusals are shown). */
function controlsFor(status: RunStatus): Control[] {
  if (ENDED.includes(status)) return [];
  const controls: Control[] = ['cancel', 'kill'];
  if (status !== 'paused') controls.push('pause');
  if (status === 'paused' || status === 'awaiting_approval' || status === 'throttled') controls.push('resume');
  return controls;
}

function RunDetail({ which, onChanged }: { which: { run_id: string; tenant_id: string }; onChanged: () => void }) {
  const { client, principal } = useSession();
  const [run, setRun] = useState<Run | null>(null);
  const load = useAction<Run>();
  const control = useAction<unknown>();
  const [note, setNote] = useState<string | null>(null);
  const tenantQuery = isPlatform(principal) ? { tenant_id: which.tenant_id } : {};

  const refresh = async () => {
    const outcome = await load.run(() =>
      attempt(client.GET('/runs/{run_id}', { params: { path: { run_id: which.run_id }, query: tenantQuery } })),
    );
    if (outcome.ok) setRun(outcome.data);
  };
  useEffect(() => void refresh(), []);

  const act = async (verb: Control, reason: string) => {
    const params = { path: { run_id: which.run_id }, query: tenantQuery };
    const body = reason ? { reason } : {};
    const outcome = await control.run(() => attempt<unknown>(client.POST(`/runs/{run_id}/${verb}`, { params, body })));
    if (outcome.ok) {
      const status = (outcome.data as { status?: string }).status;
      setNote(`${verb}: the run is now ${status ?? 'changed'}.`);
      await refresh();
      onChanged();
    }
  };

  return (
    <section class="panel" aria-labelledby="run-title">
      <h2 id="run-title">
        Run <code>{which.run_id}</code>
      </h2>
      <RefusalNote refusal={load.refusal} />
      {run ? (
        <>
          <Facts
            facts={[
              ['Status', <span class={`badge ${run.status}`}>{run.status}</span>],
              ['Agent', <code>{run.agent_id}</code>],
              ['Tenant', <code>{run.tenant_id}</code>],
              ['Parent run', run.parent_run_id],
              ['Budget', run.budget ? `${run.budget.spent_units} spent of ${run.budget.budget_units}` : null],
              ['Started', <When at={run.created_at} />],
              ['Updated', <When at={run.updated_at} />],
            ]}
          />
          {run.warnings.length > 0 ? <p>Warnings: {run.warnings.join(', ')}</p> : null}
          <h3>Steps</h3>
          <div class="table-wrap" tabIndex={0} role="region" aria-label="Steps table">
            <table>
              <thead>
                <tr>
                  <th scope="col">#</th>
                  <th scope="col">Tool</th>
                  <th scope="col">Status</th>
                  <th scope="col">Verdict</th>
                  <th scope="col">Duration</th>
                  <th scope="col">Cost</th>
                  <th scope="col">Audit id</th>
                </tr>
              </thead>
              <tbody>
                {run.steps.map((step) => (
                  <tr key={step.index}>
                    <td>{step.index}</td>
                    <td>
                      <code>
                        {step.tool_id}
                        {step.version ? ` ${step.version}` : ''}
                      </code>
                    </td>
                    <td>
                      <span class={`badge ${step.status}`}>{step.status}</span>
                    </td>
                    <td>
                      {step.error ? (
                        <>
                          <code>{step.error.code}</code> {step.error.message}
                        </>
                      ) : step.approval_id ? (
                        <>
                          waits for <a href="#/approvals">{step.approval_id}</a>
                        </>
                      ) : step.status === 'completed' ? (
                        'admitted'
                      ) : (
                        '—'
                      )}
                    </td>
                    <td>{step.duration_ms.toFixed(1)} ms</td>
                    <td>{step.cost_units}</td>
                    <td>{step.audit_id ? <code>{step.audit_id}</code> : '—'}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
          <RunControls status={run.status} busy={control.busy} onControl={act} />
          <RefusalNote refusal={control.refusal} />
          {note && !control.refusal ? <p role="status">{note}</p> : null}
        </>
      ) : null}
    </section>
  );
}

function RunControls(props: { status: RunStatus; busy: boolean; onControl: (verb: Control, reason: string) => void }) {
  const controls = controlsFor(props.status);
  if (controls.length === 0) return <p>This run has ended; no control applies.</p>;
  const submit = (event: SubmitEvent) => {
    event.preventDefault();
    const verb = (event.submitter as HTMLButtonElement | null)?.value as Control;
    props.onControl(verb, formValues(event.currentTarget as HTMLFormElement).reason ?? '');
  };
  return (
    <form class="inline" aria-label="Run controls" onSubmit={submit}>
      <label for="run-control-reason">Reason (optional)</label>
      <input id="run-control-reason" name="reason" maxLength={2000} />
      {controls.map((verb) => (
        <button key={verb} type="submit" value={verb} disabled={props.busy} class={verb === 'kill' ? 'danger' : ''}>
          {verb[0]!.toUpperCase() + verb.slice(1)} run
        </button>
      ))}
    </form>
  );
}
