import { createToolgateClient, refusal, type Schemas, type ToolgateClient } from 'toolgate/client';

export type { Schemas, ToolgateClient };
export type Principal = Schemas['Principal'];

/** What the API answered when it refused: its code and message, shown as they are. */
export interface Refusal {
  status: number;
  code: string;
  message: string;
}

export type Outcome<T> = { ok: true; data: T; status: number } | { ok: false; refusal: Refusal };

/** Awaits a call of the typed client: its data, or the API's refusal (never a thrown error). */
export async function attempt<T>(
  call: Promise<{ data?: T; error?: unknown; response: Response }>,
): Promise<Outcome<T>> {
  try {
    const { data, error, response } = await call;
    if (response.ok) return { ok: true, data: data as T, status: response.status };
    const refused = refusal(response.status, error);
    return { ok: false, refusal: { status: refused.status, code: refused.code, message: refused.message } };
  } catch (error) {
    return { ok: false, refusal: { status: 0, code: 'unreachable', message: (error as Error).message } };
  }
}

/** A client of the gateway that served the console, carrying the operator's token. */
export function clientFor(token: string): ToolgateClient {
  return createToolgateClient({ baseUrl: location.origin, token });
}

const TOKEN_KEY = 'toolgate.console.token';

/** The token lives in this tab's session storage only: closing the tab forgets it. */
export const session = {
  token: (): string | null => sessionStorage.getItem(TOKEN_KEY),
  keep: (token: string): void => sessionStorage.setItem(TOKEN_KEY, token),
  forget: (): void => sessionStorage.removeItem(TOKEN_KEY),
};

/**
 * A GET the typed client does not know yet (routes added after its openapi.yaml): the status and
 * body text, or status 0 when the gateway could not be reached.
 */
export async function getText(path: string): Promise<{ status: number; text: string }> {
  try {
    const response = await fetch(new URL(path, location.origin), {
      headers: { authorization: `Bearer ${session.token() ?? ''}` },
    });
    return { status: response.status, text: await response.text() };
  } catch (error) {
    return { status: 0, text: (error as Error).message };
  }
}
