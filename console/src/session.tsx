import { createContext } from 'preact';
import { useContext } from 'preact/hooks';
import type { Principal, ToolgateClient } from './api.js';

export interface Session {
  client: ToolgateClient;
  principal: Principal;
}

export const SessionContext = createContext<Session | null>(null);

/** The signed-in operator and a client carrying its token; pages render only inside a session. */
export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) throw new Error('useSession outside a signed-in console');
  return session;
}

export const isPlatform = (principal: Principal) => principal.role === 'platform-operator';

/** What the signed-in role may do, in one sentence, as the API's authority rules have it. */
export function mayDo(principal: Principal): string {
  if (isPlatform(principal))
    return 'As a platform-operator you act in every tenant: approvals, platform-wide and tenant kill switches, runs, grants, the audit log and its verification, and the tool registry.';
  return `As a tenant-operator you act in tenant ${principal.tenant_id} only: its approvals, its tenant, family, agent and tool kill switches, its runs, grants and audit log. The tool catalog is read-only to you.`;
}
