import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { sql } from 'kysely';
import { chromium, type Browser, type Locator, type Page } from 'playwright-core';
import { build } from 'vite';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TestBackend } from './helpers/backend.js';
import { startHarness, type Harness } from './helpers/harness.js';
import { execute, step } from './helpers/runs.js';
import { tokens } from './helpers/tokens.js';
import { until } from './helpers/waits.js';
import { grantTool, newRunId, registerTool } from './helpers/world.js';

// The operator console in Debian's Chromium, against a real gateway on a real port and PostgreSQL.
const CHROMIUM = '/usr/bin/chromium';
const hasChromium = existsSync(CHROMIUM);
const root = new URL('..', import.meta.url).pathname;
const screenshots = join(root, 'test-output', 'console');

const T = 'tenant-console';
const OTHER = 'tenant-console-other';
const AGENT = 'veritas.drafter';
const OTHER_AGENT = 'acme.helper';
const agent = tokens.agent(AGENT, { tenant: T });
const otherAgent = tokens.agent(OTHER_AGENT, { tenant: OTHER });
const alice = tokens.tenantOperator(T, 'alice');
const bob = tokens.tenantOperator(T, 'bob');
const outsider = tokens.tenantOperator(OTHER, 'mallory');
const platform = tokens.platform('ops.root');

let h: Harness;
let backend: TestBackend;
let browser: Browser;
let page: Page;
let url: string;

const run = (tool: string, q = 'hello', token = agent, runId = newRunId('console')) =>
  execute(h.client, token, { run_id: runId, plan: [step(tool, q)] });

/** Within the page, the card (an article) whose text includes `text`. */
const card = (text: string): Locator => page.getByRole('article').filter({ hasText: text });
const button = (name: string, scope: Page | Locator = page) => scope.getByRole('button', { name, exact: true });
const field = (name: string, scope: Page | Locator = page) => scope.getByLabel(name, { exact: true });
const runLink = (runId: string) => page.getByRole('link', { name: runId, exact: true });
/** The text of the listing's line saying when it last answered. */
const lastRefresh = () => page.locator('.listing .toolbar .muted').innerText();

/** Evaluates `expression` in the page (a string: this file is type-checked without the DOM's types). */
const inPage = <T = unknown>(expression: string): Promise<T> => page.evaluate<T>(expression);

/** Saves the page as `<name>.png`; long listings only as far as the window shows. */
async function shot(name: string, fullPage = true): Promise<void> {
  await page.screenshot({ path: join(screenshots, `${name}.png`), fullPage });
}

async function signIn(token: string): Promise<void> {
  await page.goto(`${url}/console`);
  // A token kept in the tab is checked first ("Checking your session…"): wait until either form shows.
  await field('Operator token').or(button('Sign out')).first().waitFor();
  if (await button('Sign out').isVisible()) await button('Sign out').click();
  await field('Operator token').fill(token);
  await button('Sign in').click();
  await page.getByText('Signed in as').waitFor();
}

async function open(link: string): Promise<void> {
  await page.getByRole('navigation', { name: 'Console pages' }).getByRole('link', { name: link, exact: true }).click();
  await page.getByRole('heading', { level: 1, name: link }).waitFor();
}

describe.skipIf(!hasChromium)(
  hasChromium ? 'the operator console' : `the operator console (skipped: no Chromium at ${CHROMIUM})`,
  () => {
    beforeAll(async () => {
      // The gateway serves dist/console: build it as `npm run build` would, so the test sees this tree.
      await build({ configFile: join(root, 'console', 'vite.config.ts'), logLevel: 'silent' });
      await mkdir(screenshots, { recursive: true });
      // On an open chain: the Audit page shows the chain's head beside the tree.
      h = await startHarness({}, { chain: 'open' });
      url = await h.client.app.listen({ port: 0, host: '127.0.0.1' });
      backend = await new TestBackend().start();
      const agents = { allowed_agents: [AGENT, OTHER_AGENT], category: 'draft_write' };
      await registerTool(h.client, {
        id: 'draft.publish',
        backendUrl: `${backend.url}/echo`,
        ...agents,
        requires_approval: true,
      });
      await registerTool(h.client, { id: 'lookup', backendUrl: `${backend.url}/echo`, ...agents });
      await registerTool(h.client, { id: 'lookup.revocable', backendUrl: `${backend.url}/echo`, ...agents });
      for (const tool of ['draft.publish', 'lookup']) await grantTool(h.client, { tenant: T, agent: AGENT, tool });
      await grantTool(h.client, { tenant: OTHER, agent: OTHER_AGENT, tool: 'lookup' });
      browser = await chromium.launch({ executablePath: CHROMIUM, headless: true });
      page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
      // A step that waits in vain fails on its own line, well inside the test's timeout.
      page.setDefaultTimeout(8_000);
    });

    afterAll(async () => {
      await browser?.close();
      await backend?.close();
      await h?.close();
    });

    it('signs in with an operator token kept in session storage only, showing who it is and what its role may do', async () => {
      await page.goto(`${url}/console`);
      await shot('sign-in');
      await field('Operator token').fill('not-a-token');
      await button('Sign in').click();
      await page.getByRole('alert').filter({ hasText: 'unauthenticated' }).waitFor();

      await field('Operator token').fill(agent);
      await button('Sign in').click();
      await page.getByRole('alert').filter({ hasText: 'agent_forbidden' }).waitFor();

      await signIn(alice);
      const header = await page.getByRole('banner').innerText();
      expect(header).toContain('Signed in as alice');
      expect(header).toContain('tenant-operator');
      expect(header).toContain(`tenant ${T} only`);
      const storage = await inPage(
        `({ session: sessionStorage.getItem('toolgate.console.token'), local: localStorage.length, cookies: document.cookie })`,
      );
      expect(storage).toEqual({ session: alice, local: 0, cookies: '' });

      // A reload keeps the session (same tab); signing out forgets the token.
      await page.reload();
      await page.getByText('Signed in as').waitFor();
      await button('Sign out').click();
      await field('Operator token').waitFor();
      expect(await inPage('sessionStorage.length')).toBe(0);
    });

    it("lists an agent's approval-gated call under Approvals; approving it with a rationale lets the agent's resume dispatch it", async () => {
      const runId = newRunId('approve');
      const held = await run('draft.publish', 'publish the summary', agent, runId);
      expect(held.status).toBe(202);
      const approvalId = held.body.steps[0].approval_id as string;

      await signIn(alice);
      await open('Approvals');
      const proposal = card(runId);
      await proposal.waitFor();
      const text = await proposal.innerText();
      expect(text).toContain('draft.publish 1.0.0');
      expect(text).toContain(AGENT);
      expect(text).toContain('"q": "publish the summary"');
      expect(text).toContain(approvalId);
      expect(text).toMatch(/SHA-256 [0-9a-f]{64}/);

      // The rationale is required: an empty one does not go out.
      await button('Approve', proposal).click();
      expect((await h.client.get(`/approvals/${approvalId}`, { token: alice })).body.status).toBe('pending');

      await field('Rationale', proposal).fill('the summary reads right');
      await button('Approve', proposal).click();
      await proposal.getByText('approved by operator:alice').waitFor();

      const resumed = await h.client.post(`/runs/${runId}/resume`, { token: agent, body: {} });
      expect(resumed.status).toBe(200);
      expect(resumed.body.status).toBe('completed');
      expect(backend.hitsOfRun(runId).map((hit) => hit.body)).toEqual([{ q: 'publish the summary' }]);
    });

    it('shows an approval created through the API on the open Approvals page within 5 s, without a reload, marked new and counted on the tab, keeping what the operator types', async () => {
      const firstRun = newRunId('typing');
      expect((await run('draft.publish', 'being read', agent, firstRun)).status).toBe(202);
      await signIn(alice);
      await open('Approvals');
      const reading = card(firstRun);
      await field('Rationale', reading).fill('half a thought');
      await inPage('window.notReloaded = true');

      const laterRun = newRunId('live');
      const held = await run('draft.publish', 'arrived later', agent, laterRun);
      expect(held.status).toBe(202);
      const arrived = card(laterRun);
      // SPEC §14.1: at most 5 s behind.
      await arrived.waitFor({ timeout: 5_000 });
      expect(await inPage('window.notReloaded')).toBe(true);
      expect(await arrived.locator('.badge.new').innerText()).toBe('new');
      expect(await reading.locator('.badge.new').count()).toBe(0);
      await page.getByRole('status').filter({ hasText: '1 new since you opened this page' }).waitFor();
      const pending = (await h.client.get('/approvals', { token: alice, query: { status: 'pending' } })).body.items;
      const tab = page.getByRole('navigation', { name: 'Console pages' }).locator('.count');
      await until('the tab to count the pending approvals', async () =>
        (await tab.innerText()).startsWith(String(pending.length)),
      );
      // What the operator was typing, and where, is as it was.
      expect(await field('Rationale', reading).inputValue()).toBe('half a thought');
      expect(await inPage('document.activeElement?.tagName')).toBe('TEXTAREA');
      await shot('approvals');

      await field('Rationale', arrived).fill('fine to publish');
      await button('Approve', arrived).click();
      await arrived.getByText('approved by operator:alice').waitFor();
      // The next refresh no longer lists it as pending; its card stays, with the outcome.
      const before = await lastRefresh();
      await until('a refresh after the decision', async () => (await lastRefresh()) !== before);
      expect(await arrived.innerText()).toContain('approved by operator:alice');
      expect((await h.client.get(`/approvals/${held.body.steps[0].approval_id}`, { token: alice })).body.status).toBe(
        'approved',
      );

      // A hidden tab asks nothing; shown again, it asks at once.
      const asked: string[] = [];
      page.on('request', (request) => asked.push(new URL(request.url()).pathname));
      const setVisibility = (state: string) =>
        inPage(
          `Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => '${state}' }); document.dispatchEvent(new Event('visibilitychange'))`,
        );
      await setVisibility('hidden');
      asked.length = 0;
      await new Promise((resolve) => setTimeout(resolve, 5_000));
      expect(asked.filter((path) => path === '/approvals')).toEqual([]);
      await setVisibility('visible');
      await until('a request once visible', () => asked.includes('/approvals'), { timeoutMs: 1_000 });
      page.removeAllListeners('request');
    });

    it("refuses an operator's approval of its own proposal, showing the API's code and message", async () => {
      // An operator's resume proposes the run's next held call itself: bob cannot approve what he proposed.
      const runId = newRunId('self');
      const held = await execute(h.client, agent, {
        run_id: runId,
        plan: [step('draft.publish', 'first'), step('draft.publish', 'second')],
      });
      await h.client.post(`/approvals/${held.body.steps[0].approval_id}/approve`, {
        token: alice,
        body: { rationale: 'first is fine' },
      });
      const resumed = await h.client.post(`/runs/${runId}/resume`, { token: bob, body: {} });
      expect(resumed.status).toBe(202);

      await signIn(bob);
      await open('Approvals');
      const proposal = card(runId);
      await proposal.getByText('Your own request proposed this action').waitFor();
      await field('Rationale', proposal).fill('looks fine to me');
      await button('Approve', proposal).click();
      const refusal = await proposal.getByRole('alert').innerText();
      expect(refusal).toContain('forbidden');
      const answer = await h.client.post(`/approvals/${resumed.body.steps[1].approval_id}/approve`, {
        token: bob,
        body: { rationale: 'again' },
      });
      expect(refusal).toContain(answer.body.error.message);
    });

    it('arming a switch on the agent refuses its next call; disarming restores it', async () => {
      expect((await run('lookup')).status).toBe(200);
      await signIn(alice);
      await open('Kill switches');
      const arm = page.getByRole('form', { name: 'Arm a switch' });
      await field('Scope', arm).selectOption('agent');
      await field('Target', arm).fill(AGENT);
      expect(await field('Tenant', arm).inputValue()).toBe(T);
      await field('Reason', arm).fill('drafts look wrong');
      await field('Status copy', arm).fill('Drafting is paused for review.');
      await button('Arm', arm).click();
      await arm.getByRole('status').filter({ hasText: 'Armed' }).waitFor();

      const refused = await run('lookup');
      expect(refused.status).toBe(403);
      expect(refused.body.steps[0].error.code).toBe('kill_switch_active');
      expect(refused.body.steps[0].error.message).toContain('Drafting is paused for review.');

      const decide = page.getByRole('form', { name: 'What stops this call?' });
      await field('Agent', decide).fill(AGENT);
      await field('Tool', decide).fill('lookup');
      await button('Check', decide).click();
      await decide.getByText('Stopped (kill_switch_active) by the agent switch').waitFor();
      await shot('kill-switches');

      const armed = card(`agent ${AGENT}`);
      await field('Reason', armed).fill('reviewed');
      await button('Disarm', armed).click();
      await page.getByText('No switch is armed.').waitFor();
      expect((await run('lookup')).status).toBe(200);
    });

    it('shows a switch armed elsewhere on the open Kill switches page, marked new, keeping the form being filled', async () => {
      await signIn(alice);
      await open('Kill switches');
      await page.getByText('No switch is armed.').waitFor();
      const decide = page.getByRole('form', { name: 'What stops this call?' });
      await field('Agent', decide).fill('someone');
      await field('Agent', decide).focus();

      const armed = await h.client.post('/kill-switches', {
        token: bob,
        body: {
          scope: 'tool',
          target: 'lookup.revocable',
          tenant_id: T,
          reason: 'armed by bob elsewhere',
          user_visible_status_copy: 'Paused.',
        },
      });
      expect(armed.status).toBe(201);
      const shown = card('tool lookup.revocable');
      await shown.waitFor({ timeout: 5_000 });
      expect(await shown.innerText()).toContain('armed by bob elsewhere');
      expect(await shown.locator('.badge.new').count()).toBe(1);
      expect(await field('Agent', decide).inputValue()).toBe('someone');
      expect(await inPage('document.activeElement?.id')).toBe('decide-agent');

      // Disarmed elsewhere, it goes by itself too.
      await h.client.post(`/kill-switches/${armed.body.id}/disarm`, { token: bob, body: { reason: 'done' } });
      await page.getByText('No switch is armed.').waitFor({ timeout: 5_000 });
    });

    it('lets a platform-operator arm a global switch only with * typed as its target and a confirmation naming what stops and what it ends', async () => {
      const heldRun = newRunId('before-global');
      expect((await run('draft.publish', 'waits', agent, heldRun)).status).toBe(202);
      const globalSwitches = async () =>
        (await h.client.get('/kill-switches', { token: platform, query: { state: 'armed', scope: 'global' } })).body
          .items;
      await signIn(platform);
      await open('Kill switches');
      const arm = page.getByRole('form', { name: 'Arm a switch' });
      // No scope is chosen for the operator: the form does not go out without one.
      expect(await field('Scope', arm).inputValue()).toBe('');
      await field('Reason', arm).fill('incident 42');
      await field('Status copy', arm).fill('Everything is paused.');
      await button('Arm', arm).click();
      expect(await inPage('document.activeElement?.id')).toBe('arm-scope');
      expect(await globalSwitches()).toEqual([]);

      // A blank target is no longer global; a target other than * is refused before anything is sent.
      await field('Scope', arm).selectOption('global');
      await button('Arm', arm).click();
      expect(await inPage('document.activeElement?.id')).toBe('arm-target');
      await field('Target', arm).fill('everything');
      await button('Arm', arm).click();
      await arm.getByRole('alert').filter({ hasText: 'type * as its target' }).waitFor();
      expect(await globalSwitches()).toEqual([]);

      // With *, a dialog names what stops and counts what it ends; Cancel arms nothing.
      await field('Target', arm).fill('*');
      await button('Arm', arm).click();
      const dialog = page.getByRole('dialog', { name: 'Arm a global switch?' });
      await dialog.getByText('every call of every tenant').first().waitFor();
      const openRuns = (
        await Promise.all(
          ['queued', 'running', 'paused', 'awaiting_approval', 'throttled'].map(
            async (status) =>
              (await h.client.get('/runs', { token: platform, query: { status, limit: 200 } })).body.items,
          ),
        )
      ).flat().length;
      const pending = (await h.client.get('/approvals', { token: platform, query: { status: 'pending', limit: 200 } }))
        .body.items.length;
      expect(openRuns).toBeGreaterThan(0);
      expect(pending).toBeGreaterThan(0);
      await dialog
        .getByRole('status')
        .filter({ hasText: `It ends ${openRuns} open run${openRuns === 1 ? '' : 's'} and ${pending} pending approval` })
        .waitFor();
      expect(await inPage('document.activeElement?.textContent')).toBe('Cancel');
      await shot('kill-switches-confirm', false);
      await button('Cancel', dialog).click();
      await dialog.waitFor({ state: 'hidden' });
      expect(await globalSwitches()).toEqual([]);

      await button('Arm', arm).click();
      await button('Arm: stop every call of every tenant', dialog).click();
      try {
        await arm.getByRole('status').filter({ hasText: 'Armed' }).waitFor();
        const armed = await globalSwitches();
        expect(armed.map((item: any) => [item.target, item.tenant_id])).toEqual([['*', null]]);
        expect((await h.client.get(`/runs/${heldRun}`, { token: alice })).body.status).not.toBe('awaiting_approval');
        // The form starts blank again: the next switch's scope is chosen afresh.
        expect(await field('Scope', arm).inputValue()).toBe('');
      } finally {
        for (const item of await globalSwitches())
          await h.client.post(`/kill-switches/${item.id}/disarm`, { token: platform, body: { reason: 'test over' } });
      }
    });

    it('grants a tool with a TTL, explains the resolution, and revoking the grant refuses the next call', async () => {
      expect((await run('lookup.revocable')).body.steps[0].error.code).toBe('grant_missing');
      await signIn(alice);
      await open('Grants');
      const create = page.getByRole('form', { name: 'Grant a tool' });
      await field('Agent', create).fill(AGENT);
      await field('Tool', create).fill('lookup.revocable');
      await field('TTL', create).selectOption({ label: '8 hours' });
      await field('Rationale', create).fill('needed for the review');
      await button('Grant', create).click();
      await create.getByRole('status').filter({ hasText: 'Granted' }).waitFor();
      expect((await run('lookup.revocable')).status).toBe(200);
      const grants = (await h.client.get('/grants', { token: alice, query: { tool_id: 'lookup.revocable' } })).body;
      const hours = (Date.parse(grants.items[0].expires_at) - Date.now()) / 3600_000;
      expect(hours).toBeGreaterThan(7.9);
      expect(hours).toBeLessThanOrEqual(8);

      const granted = card('lookup.revocable');
      await field('Reason', granted).fill('review finished');
      await button('Revoke', granted).click();
      await granted.getByText('Revoked.').waitFor();
      const refused = await run('lookup.revocable');
      expect(refused.status).toBe(403);
      expect(refused.body.steps[0].error.code).toBe('grant_revoked');

      const resolve = page.getByRole('form', { name: "Why can't an agent call a tool?" });
      await field('Agent', resolve).fill(AGENT);
      await field('Tool', resolve).fill('lookup.revocable');
      await button('Explain', resolve).click();
      await resolve.getByText('Refused: grant_revoked').waitFor();
      await shot('grants');
    });

    it("shows runs with their steps, verdicts and audit ids; a tenant-operator never sees another tenant's runs", async () => {
      const ours = newRunId('ours');
      const theirs = newRunId('theirs');
      expect((await run('lookup', 'ours', agent, ours)).status).toBe(200);
      expect((await run('lookup', 'theirs', otherAgent, theirs)).status).toBe(200);

      await signIn(alice);
      await open('Runs');
      await runLink(ours).waitFor();
      expect(await runLink(theirs).count()).toBe(0);
      await field('Status').selectOption('completed');
      await field('Agent').fill(AGENT);
      await button('Filter').click();
      await until('only completed runs listed', async () =>
        (await page.getByRole('region', { name: 'Runs table' }).locator('tbody .badge').allInnerTexts()).every(
          (status) => status === 'completed' || status === 'new',
        ),
      );
      await shot('runs');
      await runLink(ours).click();
      const detail = page.getByRole('region', { name: `Run ${ours}` });
      const steps = await detail.getByRole('region', { name: 'Steps table' }).innerText();
      expect(steps).toContain('lookup 1.0.0');
      expect(steps).toContain('completed');
      const audit = (await h.client.get('/audit', { token: alice, query: { run_id: ours } })).body.items;
      const outcome = audit.find((event: any) => event.event_type === 'run.step.completed');
      expect(steps).toContain(outcome.event_id);

      await signIn(outsider);
      await open('Runs');
      await runLink(theirs).waitFor();
      expect(await runLink(ours).count()).toBe(0);
    });

    it('pauses and cancels a run from its controls where the API allows them', async () => {
      const runId = newRunId('controls');
      expect((await run('draft.publish', 'held', agent, runId)).status).toBe(202);
      await signIn(alice);
      // A link to the run, followed while the Runs page already shows.
      await open('Runs');
      await page.goto(`${url}/console#/runs?run=${runId}`);
      const detail = page.getByRole('region', { name: `Run ${runId}` });
      await button('Pause run', detail).click();
      await detail.getByRole('status').filter({ hasText: 'the run is now paused' }).waitFor();
      await button('Cancel run', detail).click();
      await detail.getByText('This run has ended').waitFor();
      expect((await h.client.get(`/runs/${runId}`, { token: alice })).body.status).toBe('cancelled');
    });

    it('opens a run as its own view (its id in the URL, the focus on its heading); Back returns to the list where it was', async () => {
      const runs: string[] = [];
      for (let i = 0; i < 24; i += 1) {
        const runId = newRunId(`many${i}`);
        expect((await run('lookup', `n${i}`, agent, runId)).status).toBe(200);
        runs.push(runId);
      }
      await signIn(alice);
      await open('Runs');
      // A run started while the list is open (once it has answered) appears on its own, marked new.
      await until('the list to have answered', async () => (await lastRefresh()).includes('last at'));
      const started = newRunId('started');
      expect((await run('lookup', 'later', agent, started)).status).toBe(200);
      await runLink(started).waitFor({ timeout: 5_000 });
      expect(await page.getByRole('row').filter({ hasText: started }).locator('.badge.new').count()).toBe(1);
      // The oldest of the 24 is at the bottom of the first page, below the window.
      const far = runLink(runs[1]!);
      await far.scrollIntoViewIfNeeded();
      const scrolled = await inPage<number>('window.scrollY');
      expect(scrolled).toBeGreaterThan(0);
      await far.click();

      await page.getByRole('heading', { level: 1, name: `Run ${runs[1]}` }).waitFor();
      expect(await inPage('location.hash')).toBe(`#/runs/${runs[1]}?tenant=${T}`);
      await until(
        'the heading to have the focus',
        async () => (await inPage('document.activeElement?.tagName')) === 'H1',
      );
      expect(await runLink(runs[0]!).isVisible()).toBe(false);
      const detail = page.getByRole('region', { name: `Run ${runs[1]}` });
      expect(await detail.getByRole('region', { name: 'Steps table' }).innerText()).toContain('lookup 1.0.0');
      expect(await detail.boundingBox().then((box) => box!.y)).toBeLessThan(300);
      await shot('run');

      await button('Back to runs').click();
      await page.getByRole('heading', { level: 1, name: 'Runs' }).waitFor();
      await until(
        'the focus back on the run opened',
        async () => (await inPage('document.activeElement?.textContent')) === runs[1],
      );
      expect(Math.abs((await inPage<number>('window.scrollY')) - scrolled)).toBeLessThan(50);
      expect(await inPage('location.hash')).toBe('#/runs');

      // A link to the run opens it too, and the browser's Back returns.
      await page.goto(`${url}/console#/runs/${runs[0]}`);
      await page.getByRole('heading', { level: 1, name: `Run ${runs[0]}` }).waitFor();
      await page.goBack();
      await page.getByRole('heading', { level: 1, name: 'Runs' }).waitFor();
    });

    it('Verify shows the chain ok with its head; the audit log pages with its cursors', async () => {
      // Enough events for a second page of 50.
      const { body } = await h.client.get('/audit', { token: platform, query: { limit: 60 } });
      for (let i = body.items.length; i <= 55; i += 1)
        await registerTool(h.client, { id: `filler.tool_${i}`, backendUrl: `${backend.url}/echo` });

      await signIn(platform);
      await open('Audit');
      // The log's signed checkpoint beside the hash chain's Verify.
      await page.getByRole('region', { name: 'Events table' }).waitFor();
      await page.getByRole('heading', { name: 'Signed checkpoint' }).waitFor();
      await button('Verify').click();
      const verdict = await page.getByRole('status').filter({ hasText: 'Chain state' }).innerText();
      expect(verdict).toContain('Chain state: ok');
      expect(verdict).toMatch(/Head: seq \d+, hash [0-9a-f]{64}/);
      await shot('audit', false);

      // At 1280 px the table fits: its last columns are on screen and the ids wrap inside their cells.
      const table0 = page.getByRole('region', { name: 'Events table' });
      for (const column of ['Status', 'Reason code']) {
        const box = await table0.getByRole('columnheader', { name: column, exact: true }).boundingBox();
        expect(box!.x + box!.width).toBeLessThanOrEqual(1280);
      }
      expect(
        await table0.evaluate(
          (element) =>
            (element as unknown as { scrollWidth: number; clientWidth: number }).scrollWidth -
            (element as unknown as { clientWidth: number }).clientWidth,
        ),
      ).toBeLessThanOrEqual(0);

      const table = page.getByRole('region', { name: 'Events table' });
      const firstSeq = async () => Number(await table.locator('tbody tr td').first().innerText());
      const newest = await firstSeq();
      // The page number moves at the click, the rows when they arrive.
      await button('Next page').click();
      await page.getByText('Page 2').waitFor();
      await until('the second page listed', async () => (await firstSeq()) === newest - 50);
      await button('Previous page').click();
      await page.getByText('Page 1').waitFor();
      await until('the first page listed again', async () => (await firstSeq()) === newest);

      await field('Event type').fill('grant.created');
      await button('Filter').click();
      const types = () => table.locator('tbody th').allInnerTexts();
      await until('only grant.created events listed', async () => (await types()).every((t) => t === 'grant.created'));
      expect((await types()).length).toBeGreaterThan(0);
    });

    it('checks a record\'s inclusion proof against the signed checkpoint in the browser, saying "verified here"', async () => {
      const { items } = (await h.client.get('/audit', { token: platform, query: { limit: 50 } })).body;
      const [honest, tampered] = [items[0], items[1]];
      await until('both records to be in a published checkpoint', async () =>
        (
          await Promise.all(
            [honest, tampered].map((r) => h.client.get(`/audit/events/${r.event_id}/inclusion`, { token: platform })),
          )
        ).every((res) => res.status === 200),
      );
      // Edited in the database after it was sequenced, as someone with database access could.
      const db = h.db.database.control;
      const edit = (reason: string | null) =>
        sql`update audit_events set reason_code = ${reason} where event_id = ${tampered.event_id}`.execute(db);
      await sql`alter table audit_events disable trigger audit_events_no_update_delete`.execute(db);
      await edit('edited');
      try {
        await signIn(platform);
        await open('Audit');
        const panel = page.getByRole('region', { name: 'Signed checkpoint' });
        await panel.getByRole('status').filter({ hasText: 'Signature verified here' }).waitFor();
        expect(await panel.innerText()).toMatch(/tree size \d+/);
        const table = page.getByRole('region', { name: 'Events table' });
        await table.getByRole('button', { name: `Check event ${honest.event_id} in the log` }).click();
        await table.getByRole('status').filter({ hasText: 'verified here' }).waitFor();
        await table.getByRole('button', { name: `Check event ${tampered.event_id} in the log` }).click();
        await table.getByRole('alert').filter({ hasText: 'the record does not hash to its leaf' }).waitFor();
        await shot('audit-log', false);
      } finally {
        await edit(tampered.reason_code);
        await sql`alter table audit_events enable trigger audit_events_no_update_delete`.execute(db);
      }
    });

    it('shows the catalog read-only to a tenant-operator', async () => {
      await signIn(alice);
      await open('Tools');
      const tool = page.getByRole('article', { name: 'draft.publish 1.0.0' });
      expect(await tool.innerText()).toContain('Needs approval');
      const actions = page.getByRole('main').getByRole('button').filter({ hasNotText: 'Refresh' });
      expect(await actions.count()).toBeLessThanOrEqual(2);
      await shot('tools', false);
    });

    it('works from the keyboard alone in a narrow window', async () => {
      await page.setViewportSize({ width: 390, height: 844 });
      await page.goto(`${url}/console`);
      await field('Operator token').or(button('Sign out')).first().waitFor();
      if (await button('Sign out').isVisible()) await button('Sign out').click();
      await field('Operator token').waitFor();
      await page.keyboard.press('Tab');
      expect(await inPage('document.activeElement?.id')).toBe('token');
      await page.keyboard.type(alice);
      await page.keyboard.press('Enter');
      await page.getByText('Signed in as').waitFor();
      // Tab through to the Runs link and follow it; the page's heading then has the focus.
      for (let i = 0; i < 20; i += 1) {
        await page.keyboard.press('Tab');
        if ((await inPage('document.activeElement?.textContent')) === 'Runs') break;
      }
      await page.keyboard.press('Enter');
      await page.getByRole('heading', { level: 1, name: 'Runs' }).waitFor();
      // The focus moves to the new page's heading once it has rendered.
      await until(
        'the heading to have the focus',
        async () => (await inPage('document.activeElement?.tagName')) === 'H1',
      );
      expect(await inPage('document.activeElement?.textContent')).toBe('Runs');
      const overflow = await inPage<number>('document.documentElement.scrollWidth - window.innerWidth');
      expect(overflow).toBeLessThanOrEqual(0);
      await shot('runs-narrow');
      await page.setViewportSize({ width: 1280, height: 900 });
    });
  },
);
