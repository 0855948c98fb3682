import { useState } from 'preact/hooks';
import { attempt, type Outcome, type Schemas } from '../api.js';
import { Json, Listing, PageFrame, When } from '../components.js';
import { usePaged, type Page } from '../hooks.js';
import { isPlatform, useSession } from '../session.js';

type Tool = Schemas['Tool'];
type Category = Schemas['ToolCategory'];
const CATEGORIES: Category[] = ['read_only', 'draft_write', 'final_write', 'admin', 'external_call'];

export function ToolsPage() {
  const { client, principal } = useSession();
  const [category, setCategory] = useState<Category | ''>('');
  const paged = usePaged(
    (cursor) =>
      attempt(
        client.GET('/tools', { params: { query: { limit: 50, cursor, ...(category ? { category } : {}) } } }),
      ) as Promise<Outcome<Page<Tool>>>,
    [category],
  );
  return (
    <PageFrame title="Tools">
      <p>
        The catalog: every registered version, newest first.{' '}
        {isPlatform(principal)
          ? 'Register and deprecate versions with `toolgate tools` or the API; a version never changes once registered.'
          : 'Read-only: the registry is the platform-operators’.'}
      </p>
      <div class="filters">
        <label for="tools-category">Category</label>
        <select
          id="tools-category"
          value={category}
          onChange={(event) => setCategory((event.currentTarget as HTMLSelectElement).value as Category | '')}
        >
          <option value="">any</option>
          {CATEGORIES.map((value) => (
            <option key={value} value={value}>
              {value}
            </option>
          ))}
        </select>
      </div>
      <Listing label="Tools" paged={paged} empty="No tools registered.">
        {(items) => (
          <ul class="cards">
            {items.map((tool) => (
              <li key={`${tool.id}@${tool.version}`}>
                <ToolCard tool={tool} />
              </li>
            ))}
          </ul>
        )}
      </Listing>
    </PageFrame>
  );
}

function ToolCard({ tool }: { tool: Tool }) {
  return (
    <article class="card" aria-label={`${tool.id} ${tool.version}`}>
      <h2>
        <code>{tool.id}</code> {tool.version} <span class={`badge ${tool.category}`}>{tool.category}</span>
        {tool.deprecation ? <span class="badge deprecated">deprecated</span> : null}
      </h2>
      <p>
        <strong>{tool.display_name}</strong>: {tool.description}
      </p>
      <dl class="facts">
        <div>
          <dt>Risk</dt>
          <dd>{tool.risk_level}</dd>
        </div>
        <div>
          <dt>Needs approval</dt>
          <dd>{tool.requires_approval ? 'yes' : 'no'}</dd>
        </div>
        <div>
          <dt>Agents</dt>
          <dd>{tool.allowed_agents.join(', ') || '—'}</dd>
        </div>
        <div>
          <dt>Cost units</dt>
          <dd>{tool.cost_units}</dd>
        </div>
        <div>
          <dt>Backend</dt>
          <dd>{tool.backend_configured ? 'configured' : 'none'}</dd>
        </div>
        <div>
          <dt>Registered</dt>
          <dd>
            <When at={tool.registered_at} /> by {tool.registered_by}
          </dd>
        </div>
      </dl>
      <details>
        <summary>Contract</summary>
        <Json value={tool} label={`Contract of ${tool.id} ${tool.version}`} />
      </details>
    </article>
  );
}
