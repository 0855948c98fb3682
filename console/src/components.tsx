import { Fragment, type ComponentChildren } from 'preact';
import { useEffect, useRef } from 'preact/hooks';
import type { Refusal } from './api.js';
import type { Paged } from './hooks.js';

/** The API's refusal, as it said it: code first, then its message. */
export function RefusalNote({ refusal }: { refusal: Refusal | null }) {
  if (!refusal) return null;
  return (
    <p class="refusal" role="alert">
      <strong>Refused:</strong> <code>{refusal.code}</code> {refusal.message}
    </p>
  );
}

/** A page of the console: its heading takes the focus when it opens, so screen readers announce it. */
export function PageFrame({ title, children }: { title: string; children: ComponentChildren }) {
  const heading = useRef<HTMLHeadingElement>(null);
  useEffect(() => {
    document.title = `${title} · toolgate console`;
    heading.current?.focus();
  }, [title]);
  return (
    <section aria-labelledby="page-title">
      <h1 id="page-title" tabIndex={-1} ref={heading}>
        {title}
      </h1>
      {children}
    </section>
  );
}

/** Loading state, refusal and the previous/next buttons of a cursor-paginated listing. */
export function Listing<T>({
  label,
  paged,
  empty,
  shown = paged.items.length,
  children,
}: {
  label: string;
  paged: Paged<T>;
  empty: string;
  /** How many entries the page shows, when it keeps some the listing no longer has. */
  shown?: number;
  children: (items: T[]) => ComponentChildren;
}) {
  return (
    <div class="listing" aria-busy={paged.loading}>
      <div class="toolbar">
        <button type="button" class="quiet" onClick={paged.reload} aria-label={`Refresh ${label.toLowerCase()}`}>
          Refresh
        </button>
        <span class="muted">
          {paged.live ? 'Updates on its own while this tab is visible' : 'Shown as loaded'}
          {paged.refreshedAt ? <>; last at {paged.refreshedAt.toLocaleTimeString()}</> : null}.
        </span>
        {/* Announced politely: what a refresh brought, never the refresh itself. */}
        <span role="status" class="arrived">
          {paged.fresh.size > 0 ? `${paged.fresh.size} new since you opened this page` : ''}
        </span>
      </div>
      <RefusalNote refusal={paged.refusal} />
      {paged.loading && shown === 0 ? <p role="status">Loading…</p> : null}
      {!paged.loading && !paged.refusal && shown === 0 ? <p>{empty}</p> : null}
      {shown > 0 ? children(paged.items) : null}
      {paged.hasNext || paged.hasPrevious ? (
        <nav class="pager" aria-label={`${label} pages`}>
          <button type="button" onClick={paged.previous} disabled={!paged.hasPrevious}>
            Previous page
          </button>
          <span>Page {paged.pageNumber}</span>
          <button type="button" onClick={paged.next} disabled={!paged.hasNext}>
            Next page
          </button>
        </nav>
      ) : null}
    </div>
  );
}

/** An id or dotted name that may wrap after its dots, colons, dashes and underscores, never mid-word. */
export function Id({ value }: { value: string }) {
  const parts = value.split(/(?<=[.:_/-])/);
  return (
    <code class="id">
      {parts.map((part, index) => (
        <Fragment key={index}>
          {index > 0 ? <wbr /> : null}
          {part}
        </Fragment>
      ))}
    </code>
  );
}

/** The mark on a row or card a refresh brought. */
export function NewMark({ show }: { show: boolean }) {
  return show ? <span class="badge new">new</span> : null;
}

export function Json({ value, label }: { value: unknown; label: string }) {
  return (
    <pre class="json" aria-label={label} tabIndex={0}>
      {JSON.stringify(value, null, 2)}
    </pre>
  );
}

export function When({ at }: { at: string | null | undefined }) {
  if (!at) return <span>—</span>;
  return <time dateTime={at}>{new Date(at).toLocaleString()}</time>;
}

/** A description list of label/value pairs. */
export function Facts({ facts }: { facts: Array<[string, ComponentChildren]> }) {
  return (
    <dl class="facts">
      {facts.map(([term, value]) => (
        <div key={term}>
          <dt>{term}</dt>
          <dd>{value ?? '—'}</dd>
        </div>
      ))}
    </dl>
  );
}

/** Form values by field name, trimmed; blank fields are left out. */
export function formValues(form: HTMLFormElement): Record<string, string> {
  const values: Record<string, string> = {};
  for (const [name, value] of new FormData(form)) {
    if (typeof value === 'string' && value.trim() !== '') values[name] = value.trim();
  }
  return values;
}

/** Time-to-live choices for grants, in seconds. */
export const TTL_CHOICES: Array<[string, number]> = [
  ['1 hour', 3600],
  ['8 hours', 8 * 3600],
  ['1 day', 86400],
  ['7 days', 7 * 86400],
  ['30 days', 30 * 86400],
];

export function TtlSelect({ id, name = 'ttl' }: { id: string; name?: string }) {
  return (
    <select id={id} name={name} defaultValue={String(86400)}>
      {TTL_CHOICES.map(([label, seconds]) => (
        <option key={seconds} value={String(seconds)}>
          {label}
        </option>
      ))}
    </select>
  );
}
