import { useEffect, useId, useState } from 'preact/hooks';
import { attempt, type Schemas } from '../api.js';
import { Facts, Json, Listing, NewMark, PageFrame, RefusalNote, When } from '../components.js';
import { useAction, usePaged } from '../hooks.js';
import { useSession } from '../session.js';

type Approval = Schemas['Approval'];
type Status = Schemas['ApprovalStatus'];
const STATUSES: Status[] = ['pending', 'approved', 'rejected', 'expired', 'cancelled'];

export function ApprovalsPage() {
  const { client } = useSession();
  const [status, setStatus] = useState<Status | ''>('pending');
  const paged = usePaged(
    (cursor) =>
      attempt(client.GET('/approvals', { params: { query: { limit: 20, cursor, ...(status ? { status } : {}) } } })),
    [status],
    { key: (approval) => approval.id, live: true },
  );
  // A card decided here stays where it was after refreshes drop it from the pending list, so the
  // operator sees the outcome; a change of filter forgets them.
  const [decidedHere, setDecidedHere] = useState<DecidedHere[]>([]);
  useEffect(() => setDecidedHere([]), [status]);
  const shown = keepInPlace(paged.items, decidedHere);
  return (
    <PageFrame title="Approvals">
      <p>
        Proposed actions wait here for a human. Approving lets the run's next resume dispatch exactly this input to
        exactly this tool version; rejecting cancels the run. Both need a rationale, and are recorded.
      </p>
      <div class="filters">
        <label for="approval-status">Show</label>
        <select
          id="approval-status"
          value={status}
          onChange={(event) => setStatus((event.currentTarget as HTMLSelectElement).value as Status | '')}
        >
          {STATUSES.map((value) => (
            <option key={value} value={value}>
              {value}
            </option>
          ))}
          <option value="">all</option>
        </select>
      </div>
      <Listing label="Approvals" paged={paged} empty="Nothing here." shown={shown.length}>
        {() => (
          <ul class="cards">
            {shown.map((approval, at) => (
              <li key={approval.id}>
                <ApprovalCard
                  approval={approval}
                  fresh={paged.fresh.has(approval.id)}
                  onDecided={(decided) =>
                    setDecidedHere((before) => [
                      ...before.filter((kept) => kept.approval.id !== decided.id),
                      { approval: decided, at },
                    ])
                  }
                />
              </li>
            ))}
          </ul>
        )}
      </Listing>
    </PageFrame>
  );
}

/** An approval decided in this view, and the place its card had then. */
interface DecidedHere {
  approval: Approval;
  at: number;
}

/** The listed approvals, with those decided here kept at their place once a refresh no longer lists them. */
function keepInPlace(listed: Approval[], decidedHere: DecidedHere[]): Approval[] {
  const shown = [...listed];
  for (const { approval, at } of decidedHere) {
    const listedAt = shown.findIndex((item) => item.id === approval.id);
    if (listedAt >= 0) shown[listedAt] = approval;
    else shown.splice(Math.min(at, shown.length), 0, approval);
  }
  return shown;
}

function ApprovalCard({
  approval: listed,
  fresh,
  onDecided,
}: {
  approval: Approval;
  fresh: boolean;
  onDecided: (approval: Approval) => void;
}) {
  const { client, principal } = useSession();
  const [approval, setApproval] = useState(listed);
  // A decision taken elsewhere (another operator, expiry) shows when a refresh brings it.
  useEffect(() => setApproval(listed), [listed.status, listed.decided_at]);
  const decision = useAction<Approval>();
  const id = useId();
  const own = approval.proposed_by.toLowerCase() === `operator:${principal.id}`.toLowerCase();

  const decide = async (event: SubmitEvent) => {
    event.preventDefault();
    const form = event.currentTarget as HTMLFormElement;
    const verb = (event.submitter as HTMLButtonElement | null)?.value === 'reject' ? 'reject' : 'approve';
    const rationale = String(new FormData(form).get('rationale') ?? '').trim();
    const path = verb === 'approve' ? '/approvals/{id}/approve' : '/approvals/{id}/reject';
    const outcome = await decision.run(() =>
      attempt(client.POST(path, { params: { path: { id: approval.id } }, body: { rationale } })),
    );
    if (outcome.ok) {
      setApproval(outcome.data);
      onDecided(outcome.data);
    }
  };

  const title =
    approval.kind === 'handoff'
      ? `Hand-off to ${approval.agent_id}`
      : `${approval.tool_id ?? '?'} ${approval.tool_version ?? ''}`.trim();
  return (
    <article class="card" aria-labelledby={`${id}-title`}>
      <h2 id={`${id}-title`}>
        {title} <span class={`badge ${approval.status}`}>{approval.status}</span> <NewMark show={fresh} />
      </h2>
      <Facts
        facts={[
          ['Agent', <code>{approval.agent_id}</code>],
          [
            'Run',
            <a href={`#/runs/${encodeURIComponent(approval.run_id)}?tenant=${encodeURIComponent(approval.tenant_id)}`}>
              {approval.run_id}
            </a>,
          ],
          ['Step', approval.step_index ?? '—'],
          ['Proposed by', <code>{approval.proposed_by}</code>],
          ['Proposed', <When at={approval.created_at} />],
          ['Expires', <When at={approval.expires_at} />],
          ['Approval', <code>{approval.id}</code>],
        ]}
      />
      {approval.kind === 'tool_call' ? (
        <>
          <h3>Input</h3>
          <Json value={approval.input} label="Input" />
          <p class="hash">
            SHA-256 <code>{approval.input_sha256}</code>
          </p>
        </>
      ) : null}
      {approval.status === 'pending' ? (
        <form class="decide" onSubmit={decide}>
          {own ? <p class="note">Your own request proposed this action: another operator has to decide it.</p> : null}
          <label for={`${id}-rationale`}>Rationale</label>
          <textarea id={`${id}-rationale`} name="rationale" required rows={2} maxLength={2000} />
          <div class="buttons">
            <button type="submit" value="approve" disabled={decision.busy}>
              Approve
            </button>
            <button type="submit" value="reject" class="danger" disabled={decision.busy}>
              Reject
            </button>
          </div>
          <RefusalNote refusal={decision.refusal} />
        </form>
      ) : (
        <p class="decided" role={decision.result ? 'status' : undefined}>
          {approval.decided_by ? (
            <>
              {approval.status} by <code>{approval.decided_by}</code> on <When at={approval.decided_at} />
              {approval.rationale ? <>: “{approval.rationale}”</> : null}
            </>
          ) : (
            approval.status
          )}
        </p>
      )}
    </article>
  );
}
