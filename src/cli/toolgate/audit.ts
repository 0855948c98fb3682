import { createReadStream, createWriteStream } from 'node:fs';
import { readFile, rename } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream as WebReadableStream } from 'node:stream/web';
import { Option, type Command } from 'commander';
import { PartitionFileVerifier, type PartitionFileVerification } from '../../audit/partition-file.js';
import type { Schemas } from '../../client/index.js';
import { cell, parseDuration, parseInteger, table } from './format.js';
import { command, listOptions, type ListOptions } from './help.js';
import { treeCommands } from './audit-tree.js';
import { keep, readKept } from './kept.js';
import { CheckFailed, followOnce, Session, UsageError } from './session.js';
import { jsonText, printable } from './terminal.js';

type AuditEvent = Schemas['AuditEvent'];

interface Filters {
  tenant?: string;
  run?: string;
  tool?: string;
  agent?: string;
  type?: string;
}

const filtered = (cmd: ReturnType<typeof command>) =>
  cmd
    .option('--tenant <id>')
    .option('--run <id>')
    .option('--tool <id>')
    .option('--agent <id>')
    .option('--type <event-type>', 'e.g. grant.revoked');

const query = (f: Filters) => ({
  tenant_id: f.tenant,
  run_id: f.run,
  tool_id: f.tool,
  agent_id: f.agent,
  event_type: f.type,
});

function eventLine(e: AuditEvent): string {
  const about = [
    ['actor', e.actor],
    ['agent', e.agent_id],
    ['tool', e.tool_id],
    ['run', e.run_id],
    ['status', e.status],
    ['reason', e.reason_code],
  ]
    .filter(([, value]) => value !== null)
    .map(([key, value]) => `${key}=${cell(value)}`);
  return [e.seq, e.occurred_at ?? '-', e.event_type, ...about].join(' ');
}

/** The head kept outside the database (`--anchor FILE`). */
interface Anchor {
  seq: number;
  hash: string;
}

async function readAnchor(file: string): Promise<Anchor | undefined> {
  const anchor = (await readKept(file)) as Partial<Anchor> | undefined;
  if (anchor === undefined) return undefined;
  if (!Number.isSafeInteger(anchor.seq) || typeof anchor.hash !== 'string')
    throw new UsageError(`${file}: not an anchor ({"seq": N, "hash": "..."})`);
  return anchor as Anchor;
}

/** Verifies an exported partition file offline, line by line (no gateway, no database). */
async function verifyFile(
  file: string,
  options: { key?: string; allowUnsigned?: boolean; logKey?: string },
): Promise<PartitionFileVerification> {
  const publicKeyPem = options.key ? await readFile(options.key, 'utf8') : undefined;
  const verifier = new PartitionFileVerifier({
    publicKeyPem,
    allowUnsigned: options.allowUnsigned ?? false,
    logKey: options.logKey,
  });
  for await (const line of createInterface({ input: createReadStream(file), crlfDelay: Infinity })) verifier.line(line);
  return verifier.end();
}

function fileVerdict(file: string, result: PartitionFileVerification): string {
  if (!result.ok) return `${file}: BROKEN at line ${result.first_bad_line}: ${result.reason}`;
  const h = result.header!;
  const signed = result.signature_checked ? `signed by key ${result.checkpoint?.key_id}` : 'UNSIGNED checkpoint';
  const tree = result.tree
    ? `; leaves ${result.tree.first_leaf_index}-${result.tree.first_leaf_index + result.checked - 1} of the signed tree of ${result.tree.tree_size}`
    : '';
  return `${file}: intact, ${result.checked} records of ${h.partition}, seq ${h.first_seq}-${h.last_seq}, last ${h.last_hash}; checkpoint ${result.checkpoint?.id} ${signed}${tree}`;
}

function partitionsCommands(): ReturnType<typeof command>[] {
  const list = command(
    'partitions',
    "the audit log's monthly partitions and where each stands (platform-operator)",
    'toolgate audit partitions',
  ).action(async (_options: object, cmd) => {
    const s = new Session(cmd);
    const page = await s.call(s.api.GET('/audit/partitions'));
    s.print(page, () =>
      table(
        ['NAME', 'STATE', 'FROM', 'TO', 'FIRST_SEQ', 'LAST_SEQ', 'ROWS'],
        page.items.map((p) => [p.name, p.state, p.range_start, p.range_end, p.first_seq, p.last_seq, p.rows]),
      ),
    );
  });

  const seal = command(
    'seal',
    "record a checkpoint at a finished month's last record, so that it can be exported (platform-operator)",
    'toolgate audit seal audit_events_2027_01',
  )
    .argument('<partition>')
    .action(async (name: string, _options: object, cmd) => {
      const s = new Session(cmd);
      const checkpoint = await s.call(s.api.POST('/audit/partitions/{name}/seal', { params: { path: { name } } }));
      s.print(
        checkpoint,
        () => `${name} sealed by checkpoint ${checkpoint.id} at seq ${checkpoint.seq} ${checkpoint.hash}`,
      );
    });

  const exportCmd = command(
    'export',
    'download a sealed partition as JSON Lines (platform-operator); verify it with verify-file before detaching',
    'toolgate audit export audit_events_2027_01 --out /archive/audit_events_2027_01.jsonl',
  )
    .argument('<partition>')
    .option('--out <file>', 'where to write it (default: <partition>.jsonl)')
    .action(async (name: string, options: { out?: string }, cmd) => {
      const s = new Session(cmd);
      const out = options.out ?? `${name}.jsonl`;
      const body = await s.call(
        s.api.GET('/audit/partitions/{name}/export', { params: { path: { name } }, parseAs: 'stream' }),
      );
      // Written aside, then renamed: an interrupted download never passes for the file.
      await pipeline(Readable.fromWeb(body as unknown as WebReadableStream), createWriteStream(`${out}.part`));
      await rename(`${out}.part`, out);
      s.print({ partition: name, file: out }, () => `${name} written to ${out}`);
    });

  const verifyFileCmd = command(
    'verify-file',
    "verify an exported partition offline: its chain, its header, and its checkpoint's Ed25519 signature",
    'toolgate audit verify-file audit_events_2027_01.jsonl --key /secure/toolgate-audit-public.pem',
  )
    .argument('<file>')
    .option('--key <public.pem>', "the gateway's checkpoint public key (SPKI PEM)")
    .option('--allow-unsigned', 'accept an unsigned checkpoint (the gateway signs none): chain-consistent only')
    .option(
      '--log-key <key>',
      "the log's note verifier key (GET /audit/log-info): the records must be leaves of its signed tree",
    )
    .action(async (file: string, options: { key?: string; allowUnsigned?: boolean; logKey?: string }, cmd) => {
      const json = Boolean((cmd as Command).optsWithGlobals<{ json?: boolean }>().json);
      const result = await verifyFile(file, options);
      process.stdout.write(`${json ? jsonText(result, 2) : printable(fileVerdict(file, result))}\n`);
      if (!result.ok) throw new CheckFailed(`${file} does not verify`);
    });

  const detach = command(
    'detach',
    'detach a sealed partition once its export is archived: the file is verified first, and names its last record (platform-operator)',
    'toolgate audit detach audit_events_2027_01 --file /archive/audit_events_2027_01.jsonl --key /secure/toolgate-audit-public.pem',
  )
    .argument('<partition>')
    .requiredOption('--file <file>', 'the exported file, as archived')
    .option('--key <public.pem>', "the gateway's checkpoint public key (SPKI PEM)")
    .option('--allow-unsigned', 'accept an unsigned checkpoint')
    .action(async (name: string, options: { file: string; key?: string; allowUnsigned?: boolean }, cmd) => {
      const s = new Session(cmd);
      const verified = await verifyFile(options.file, options);
      if (!verified.ok) throw new CheckFailed(`${fileVerdict(options.file, verified)}; nothing detached`);
      if (verified.header?.partition !== name)
        throw new UsageError(`${options.file} is an export of ${verified.header?.partition}, not ${name}`);
      const detached = await s.call(
        s.api.POST('/audit/partitions/{name}/detach', {
          params: { path: { name } },
          body: { last_seq: verified.header.last_seq, last_hash: verified.header.last_hash },
        }),
      );
      s.print(
        detached,
        () =>
          `${name} detached: seq ${detached.first_seq}-${detached.last_seq} archived; the table stays in the database until you drop it`,
      );
    });
  return [list, seal, exportCmd, verifyFileCmd, detach];
}

export function auditCommand() {
  const audit = command(
    'audit',
    'the tamper-evident audit log',
    'toolgate audit tail --agent a1',
    'toolgate audit verify --anchor /secure/toolgate-anchor.json',
  );

  audit.addCommand(
    filtered(
      listOptions(
        command(
          'list',
          'audit events, newest first',
          'toolgate audit list --type kill_switch.armed --since 2026-12-01T00:00:00Z',
        ),
        500,
      ),
    )
      .option('--since <time>', 'inclusive, RFC 3339')
      .option('--until <time>', 'exclusive, RFC 3339')
      .action(async (options: ListOptions & Filters & { since?: string; until?: string }, cmd) => {
        const s = new Session(cmd);
        const page = await s.page(
          options.all,
          (cursor) =>
            s.call(
              s.api.GET('/audit', {
                params: {
                  query: {
                    ...query(options),
                    since: options.since,
                    until: options.until,
                    limit: options.limit,
                    cursor,
                  },
                },
              }),
            ),
          options.cursor,
        );
        s.print(page, () =>
          table(
            ['SEQ', 'OCCURRED_AT', 'EVENT', 'ACTOR', 'AGENT', 'TOOL', 'RUN', 'STATUS', 'REASON'],
            page.items.map((e) => [
              e.seq,
              e.occurred_at,
              e.event_type,
              e.actor,
              e.agent_id,
              e.tool_id,
              e.run_id,
              e.status,
              e.reason_code,
            ]),
          ),
        );
        s.more(page.next_cursor);
      }),
  );

  audit.addCommand(
    filtered(
      command(
        'tail',
        'the latest events, then new ones as they are recorded, until interrupted (--json: one event a line)',
        'toolgate audit tail --tool web.fetch --lines 20',
      ),
    )
      .addOption(new Option('--lines <n>', 'how many recent events first').argParser(parseInteger).default(10))
      .addOption(new Option('--interval <duration>', 'how often to ask').argParser(parseDuration).default(2, '2s'))
      .action(async (options: Filters & { lines: number; interval: number }, cmd) => {
        const s = new Session(cmd);
        const show = (e: AuditEvent) => process.stdout.write(`${s.json ? jsonText(e) : printable(eventLine(e))}\n`);
        const recent =
          options.lines > 0
            ? await s.call(
                s.api.GET('/audit', { params: { query: { ...query(options), limit: Math.min(options.lines, 500) } } }),
              )
            : { items: [] };
        recent.items.reverse().forEach(show);
        let last = recent.items.at(-1);
        if (!last)
          last = (await s.call(s.api.GET('/audit', { params: { query: { ...query(options), limit: 1 } } }))).items[0];
        for (;;) {
          await new Promise((resolve) => setTimeout(resolve, options.interval * 1000));
          // Newest first, back to the last one shown; `since` a minute early, as a commit may
          // carry a time a little older than one already shown.
          const since = last?.occurred_at ? new Date(Date.parse(last.occurred_at) - 60_000).toISOString() : undefined;
          const fresh: AuditEvent[] = [];
          const seen = new Set<string>();
          let cursor: string | undefined;
          do {
            const page = await s.call(
              s.api.GET('/audit', { params: { query: { ...query(options), since, limit: 500, cursor } } }),
            );
            const newer = page.items.filter((e) => !last || e.seq > last.seq);
            fresh.push(...newer);
            cursor =
              newer.length === page.items.length && page.next_cursor ? followOnce(seen, page.next_cursor) : undefined;
          } while (cursor);
          fresh.sort((a, b) => a.seq - b.seq).forEach(show);
          last = fresh.at(-1) ?? last;
        }
      }),
  );

  audit.addCommand(
    command(
      'verify',
      "verify the log (platform-operator): the hash chain up to where it closed, and the Merkle tree's leaves; with --anchor, the chain against a head kept outside the database, then keep the new head there",
      'toolgate audit verify --anchor /secure/toolgate-anchor.json',
    )
      .option('--anchor <file>', 'a JSON file with the head of an earlier verification (created when missing)')
      .option('--from-checkpoint <id>', 'verify only the rows after this checkpoint (its signature checked first)')
      .action(async (options: { anchor?: string; fromCheckpoint?: string }, cmd) => {
        const s = new Session(cmd);
        const anchor = options.anchor ? await readAnchor(options.anchor) : undefined;
        const answer = await s.call(
          s.api.GET('/audit/verify', {
            params: {
              query: {
                ...(anchor ? { anchor_seq: anchor.seq, anchor_hash: anchor.hash } : {}),
                ...(options.fromCheckpoint ? { from_checkpoint: options.fromCheckpoint } : {}),
              },
            },
          }),
        );
        // Without from_tree_size the answer is always the chain's, with the tree's beside it.
        if (!('head' in answer)) throw new Error('the gateway answered a tree-only verification');
        const result = answer;
        if (result.ok && result.head === null && options.anchor) {
          // A log that is leaves only has no chain head to anchor: its signed checkpoints are kept instead.
          throw new UsageError(
            'the audit chain holds no record (the log is leaves only): keep its signed checkpoint with `toolgate audit witness --state FILE`',
          );
        }
        if (result.ok && result.head && options.anchor) {
          await keep(options.anchor, {
            seq: result.head.seq,
            hash: result.head.hash,
            verified_at: new Date().toISOString(),
          });
        }
        s.print(result, () => {
          if (!result.ok && result.first_bad_seq === null && result.tree && !result.tree.ok) {
            const { first_bad_leaf_index: leaf, reason, checked } = result.tree;
            return `audit tree BROKEN${leaf === null ? '' : ` at leaf ${leaf}`} (${reason}); ${checked} leaves verified before it`;
          }
          if (!result.ok) {
            const why =
              result.anchor && !result.anchor.ok
                ? ` (anchor at seq ${result.anchor.seq}: ${cell(result.anchor.reason)})`
                : '';
            return `audit chain BROKEN at seq ${result.first_bad_seq}${why}; ${rows(result.checked)} verified before it`;
          }
          const held =
            (result.from_checkpoint
              ? `; from checkpoint ${result.from_checkpoint.id} at seq ${result.from_checkpoint.seq}`
              : '') + (anchor ? `; holds the anchor at seq ${anchor.seq}` : '');
          const kept = options.anchor && result.head ? `; head kept in ${options.anchor}` : '';
          const archived = (result.archived ?? []).map(
            (r) => `; seq ${r.from_seq}-${r.to_seq} archived (${r.partition})`,
          );
          const tree = result.tree
            ? `; tree intact: ${result.tree.checked} of ${result.tree.tree_size} leaves checked`
            : '';
          return `audit chain intact: ${rows(result.checked)}${result.head ? `, head seq ${result.head.seq} ${result.head.hash}` : ''}${held}${kept}${archived.join('')}${tree}`;
        });
        if (!result.ok && result.first_bad_seq === null && result.tree && !result.tree.ok)
          throw new CheckFailed(
            `audit tree broken at leaf ${result.tree.first_bad_leaf_index} (${result.tree.reason})`,
          );
        if (!result.ok)
          throw new CheckFailed(
            `audit chain broken at seq ${result.first_bad_seq}${result.anchor?.reason ? ` (anchor: ${result.anchor.reason})` : ''}`,
          );
      }),
  );
  audit.addCommand(
    command(
      'checkpoint',
      'verify the chain since the last checkpoint and record a (signed) checkpoint of its head (platform-operator)',
      'toolgate audit checkpoint',
    ).action(async (_options: object, cmd) => {
      const s = new Session(cmd);
      const made = await s.call(s.api.POST('/audit/checkpoints', {}));
      s.print(
        made,
        () =>
          `checkpoint ${made.id} at seq ${made.seq} ${made.hash}${made.signature ? ` signed by key ${made.key_id}` : ' (unsigned)'}`,
      );
    }),
  );

  audit.addCommand(
    command('checkpoints', 'the checkpoints, newest first (platform-operator)', 'toolgate audit checkpoints --limit 5')
      .addOption(new Option('--limit <n>', 'how many').argParser(parseInteger).default(20))
      .action(async (options: { limit: number }, cmd) => {
        const s = new Session(cmd);
        const page = await s.call(s.api.GET('/audit/checkpoints', { params: { query: { limit: options.limit } } }));
        s.print(page, () =>
          page.items
            .map((c) => `${c.id}  seq ${c.seq}  ${c.at}  ${c.signature ? `key ${c.key_id}` : 'unsigned'}`)
            .join('\n'),
        );
      }),
  );
  for (const sub of treeCommands()) audit.addCommand(sub);
  for (const sub of partitionsCommands()) audit.addCommand(sub);
  return audit;
}

/** `1 row`, `2 rows`. */
function rows(count: number): string {
  return `${count} ${count === 1 ? 'row' : 'rows'}`;
}
