import { useEffect, useRef, useState } from 'preact/hooks';
import { attempt, type Schemas } from '../api.js';
import { Facts, formValues, Listing, NewMark, PageFrame, RefusalNote, When } from '../components.js';
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

interface OpenRun {
  run_id: string;
  /** The run's tenant, for a platform-operator's lookup (default their own). */
  tenant_id: string | null;
}

/** The run the URL opens: `#/runs/<id>?tenant=<tenant>` (and the older `#/runs?run=<id>`). */
export function runInHash(hash: string): OpenRun | null {
  const [path = '', query = ''] = hash.replace(/^#\/?/, '').split('?');
  const params = new URLSearchParams(query);
  const id = path.split('/').slice(1).join('/');
  const run_id = id ? decodeURIComponent(id) : params.get('run');
  return run_id ? { run_id, tenant_id: params.get('tenant') } : null;
}

export const runHref = (run: { run_id: string; tenant_id: string }) =>
  `#/runs/${encodeURIComponent(run.run_id)}?tenant=${encodeURIComponent(run.tenant_id)}`;

const rowKey = (run: { run_id: string; tenant_id: string }) => `${run.tenant_id}/${run.run_id}`;

export function RunsPage() {
  const { client, principal } = useSession();
  const [filter, setFilter] = useState<Filter>({});
  const open = runInHash(useHash());
  const openKey = open ? `${open.tenant_id ?? ''}/${open.run_id}` : null;
  // Where the list was when a run was opened from it: Back returns there.
  const left = useRef<{ scrollY: number; row: string; viaList: boolean } | null>(null);
  const paged = usePaged(
    (cursor) => attempt(client.GET('/runs', { params: { query: { limit: 25, cursor, ...filter } } })),
    [filter],
    { key: rowKey, live: open === null },
  );

  useEffect(() => {
    if (open) {
      scrollTo(0, 0);
      return;
    }
    const from = left.current;
    if (!from) return;
    left.current = null;
    // After the list is shown again (this effect runs after the page heading took the focus).
    requestAnimationFrame(() => {
      document.querySelector<HTMLElement>(`[data-run="${CSS.escape(from.row)}"]`)?.focus({ preventScroll: true });
      scrollTo(0, from.scrollY);
    });
  }, [openKey]);

  const back = () => {
    if (left.current?.viaList) history.back();
    else location.hash = '#/runs';
  };
  const applyFilter = (event: Event) => {
    event.preventDefault();
    setFilter(formValues(event.currentTarget as HTMLFormElement) as Filter);
  };
  return (
    <PageFrame title={open ? `Run ${open.run_id}` : 'Runs'}>
      {open ? (
        <RunDetail
          key={openKey}
          which={{ run_id: open.run_id, tenant_id: open.tenant_id ?? principal.tenant_id }}
          onBack={back}
          onChanged={paged.reload}
        />
      ) : null}
      <div hidden={open !== null}>
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
              <table class="runs">
                <caption class="visually-hidden">Recent runs, newest first</caption>
                <thead>
                  <tr>
                    <th scope="col">Run</th>
                    <th scope="col">Agent</th>
                    <th scope="col">Tenant</th>
                    <th scope="col">Status</th>
                    <th scope="col">Steps</th>
                    <th scope="col" class="secondary">
                      Started
                    </th>
                    <th scope="col">Updated</th>
                  </tr>
                </thead>
                <tbody>
                  {items.map((run) => (
                    <tr key={rowKey(run)} class={paged.fresh.has(rowKey(run)) ? 'fresh' : undefined}>
                      <th scope="row">
                        <a
                          href={runHref(run)}
                          data-run={rowKey(run)}
                          onClick={() => (left.current = { scrollY, row: rowKey(run), viaList: true })}
                        >
                          {run.run_id}
                        </a>{' '}
                        <NewMark show={paged.fresh.has(rowKey(run))} />
                      </th>
                      <td>{run.agent_id}</td>
                      <td>{run.tenant_id}</td>
                      <td>
                        <span class={`badge ${run.status}`}>{run.status}</span>
                      </td>
                      <td>{run.steps.length}</td>
                      <td class="secondary">
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
      </div>
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

function RunDetail({
  which,
  onBack,
  onChanged,
}: {
  which: { run_id: string; tenant_id: string };
  onBack: () => void;
  onChanged: () => void;
}) {
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
    <div class="run-detail">
      <div class="toolbar">
        <button type="button" class="quiet" onClick={onBack}>
          Back to runs
        </button>
        <button type="button" class="quiet" onClick={() => void refresh()} disabled={load.busy}>
          Refresh run
        </button>
      </div>
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
    </div>
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
