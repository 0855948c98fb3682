import { useCallback, useEffect, useMemo, useState } from 'preact/hooks';
import { attempt, clientFor, session, type Principal, type Refusal } from './api.js';
import { RefusalNote } from './components.js';
import { LIVE_INTERVAL_MS, useHash, useWhileVisible } from './hooks.js';
import { ApprovalsPage } from './pages/approvals.js';
import { AuditPage } from './pages/audit.js';
import { GrantsPage } from './pages/grants.js';
import { KillSwitchesPage } from './pages/kill-switches.js';
import { RunsPage } from './pages/runs.js';
import { ToolsPage } from './pages/tools.js';
import { mayDo, SessionContext, useSession } from './session.js';

const PAGES = [
  { path: 'approvals', title: 'Approvals', render: () => <ApprovalsPage /> },
  { path: 'kill-switches', title: 'Kill switches', render: () => <KillSwitchesPage /> },
  { path: 'runs', title: 'Runs', render: () => <RunsPage /> },
  { path: 'grants', title: 'Grants', render: () => <GrantsPage /> },
  { path: 'audit', title: 'Audit', render: () => <AuditPage /> },
  { path: 'tools', title: 'Tools', render: () => <ToolsPage /> },
] as const;

/** The page the URL's fragment names (`#/runs`, `#/runs/<id>`); the console is one document, so reloads keep it. */
function useRoute(): string {
  return useHash().replace(/^#\/?/, '').split(/[/?]/)[0] || 'approvals';
}

/** How many proposals wait for a human, asked again while the tab is visible ("100+" past a page). */
function usePendingCount(): string | null {
  const { client } = useSession();
  const [count, setCount] = useState<string | null>(null);
  const ask = useCallback(() => {
    void attempt(client.GET('/approvals', { params: { query: { status: 'pending', limit: 100 } } })).then((outcome) => {
      if (outcome.ok) setCount(`${outcome.data.items.length}${outcome.data.next_cursor ? '+' : ''}`);
    });
  }, [client]);
  useEffect(ask, [ask]);
  useWhileVisible(ask, LIVE_INTERVAL_MS);
  return count;
}

export function App() {
  const [token, setToken] = useState<string | null>(session.token);
  const [principal, setPrincipal] = useState<Principal | null>(null);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const client = useMemo(() => (token ? clientFor(token) : null), [token]);

  // A token kept from earlier in this tab is checked again before it is trusted.
  useEffect(() => {
    if (!client || principal) return;
    void signInWith(client).then((outcome) => {
      if (outcome.ok) setPrincipal(outcome.data);
      else {
        session.forget();
        setToken(null);
        setRefusal(outcome.refusal);
      }
    });
  }, [client]);

  const signOut = () => {
    session.forget();
    setPrincipal(null);
    setToken(null);
  };

  if (!client || !principal)
    return (
      <SignIn
        checking={client !== null}
        refusal={refusal}
        onSignedIn={(newToken, who) => {
          session.keep(newToken);
          setRefusal(null);
          setPrincipal(who);
          setToken(newToken);
        }}
      />
    );
  return (
    <SessionContext.Provider value={{ client, principal }}>
      <Shell principal={principal} onSignOut={signOut} />
    </SessionContext.Provider>
  );
}

async function signInWith(client: ReturnType<typeof clientFor>) {
  const outcome = await attempt(client.GET('/whoami'));
  if (outcome.ok && outcome.data.kind !== 'operator')
    return {
      ok: false as const,
      // Any operator route would answer an agent this, and record an escalation attempt besides.
      refusal: {
        status: 403,
        code: 'agent_forbidden',
        message: 'this is an agent token: the console is for operators',
      },
    };
  return outcome;
}

function SignIn(props: {
  checking: boolean;
  refusal: Refusal | null;
  onSignedIn: (token: string, principal: Principal) => void;
}) {
  const [busy, setBusy] = useState(false);
  const [refusal, setRefusal] = useState<Refusal | null>(null);
  const submit = async (event: Event) => {
    event.preventDefault();
    const token = String(new FormData(event.currentTarget as HTMLFormElement).get('token') ?? '').trim();
    setBusy(true);
    const outcome = await signInWith(clientFor(token));
    setBusy(false);
    if (outcome.ok) props.onSignedIn(token, outcome.data);
    else setRefusal(outcome.refusal);
  };
  return (
    <main id="main" class="sign-in">
      <h1>toolgate console</h1>
      {props.checking ? (
        <p role="status">Checking your session…</p>
      ) : (
        <form onSubmit={submit} aria-label="Sign in">
          <p>
            Paste an operator token. It is kept in this tab's session storage only, and forgotten when the tab closes or
            you sign out.
          </p>
          <label for="token">Operator token</label>
          <input id="token" name="token" type="password" required autoComplete="off" spellcheck={false} />
          <button type="submit" disabled={busy}>
            Sign in
          </button>
          <RefusalNote refusal={refusal ?? props.refusal} />
        </form>
      )}
    </main>
  );
}

function Shell({ principal, onSignOut }: { principal: Principal; onSignOut: () => void }) {
  const route = useRoute();
  const page = PAGES.find((candidate) => candidate.path === route) ?? PAGES[0];
  const pending = usePendingCount();
  return (
    <>
      <a
        class="skip"
        href="#main"
        onClick={(event) => (event.preventDefault(), document.getElementById('page-title')?.focus())}
      >
        Skip to content
      </a>
      <header class="top">
        <p class="brand">toolgate console</p>
        <div class="who" aria-label="Signed in">
          <p>
            Signed in as <strong>{principal.id}</strong> ({principal.role}, tenant <code>{principal.tenant_id}</code>)
          </p>
          <p class="may">{mayDo(principal)}</p>
        </div>
        <button type="button" onClick={onSignOut}>
          Sign out
        </button>
      </header>
      <nav class="pages" aria-label="Console pages">
        <ul>
          {PAGES.map((candidate) => (
            <li key={candidate.path}>
              <a href={`#/${candidate.path}`} aria-current={candidate === page ? 'page' : undefined}>
                {candidate.title}
              </a>
              {/* Beside the link, not in it, so that the link's name stays the page's. */}
              {candidate.path === 'approvals' && pending !== null && pending !== '0' ? (
                <span class="count">
                  {pending}
                  <span class="visually-hidden"> pending</span>
                </span>
              ) : null}
            </li>
          ))}
        </ul>
      </nav>
      <main id="main">{page.render()}</main>
    </>
  );
}
