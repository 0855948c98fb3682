import { describe, expect, it } from 'vitest';
import { Failed, GroupCommit } from '../../src/db/group-commit.js';

describe('group commit', () => {
  it('commits a same-tick burst as one batch, answering each request in order', async () => {
    const batches: number[][] = [];
    const group = new GroupCommit<number, number>(async (batch) => {
      batches.push(batch);
      return batch.map((n) => n * 10);
    });
    const results = await Promise.all([1, 2, 3].map((n) => group.submit(n)));
    expect(results).toEqual([10, 20, 30]);
    expect(batches).toEqual([[1, 2, 3]]);
  });

  it('serves a caller that submits again the moment its previous request is answered', async () => {
    // A request submitted between the last batch and the end of the flush used to wait forever.
    const group = new GroupCommit<number, number>(async (batch) => batch);
    const answers: number[] = [];
    for (let i = 0; i < 50; i += 1) answers.push(await group.submit(i));
    expect(answers).toHaveLength(50);
  });

  it('serves requests that arrive while a batch is in flight in the next batch', async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let started!: () => void;
    const firstBatchStarted = new Promise<void>((resolve) => (started = resolve));
    const batches: number[][] = [];
    const group = new GroupCommit<number, number>(async (batch) => {
      batches.push(batch);
      if (batches.length === 1) {
        started();
        await gate;
      }
      return batch;
    });
    const first = group.submit(1);
    // Wait for the first batch to be in flight (not for a timer, which may fire before the
    // flush's own turns of the event loop have passed, and join the first batch).
    await firstBatchStarted;
    const later = [group.submit(2), group.submit(3)];
    release();
    expect(await Promise.all([first, ...later])).toEqual([1, 2, 3]);
    expect(batches).toEqual([[1], [2, 3]]);
  });

  it('rejects every request of a failed batch and recovers for the next', async () => {
    let fail = true;
    const group = new GroupCommit<number, number>(async (batch) => {
      if (fail) throw new Error('database down');
      return batch;
    });
    await expect(Promise.all([group.submit(1), group.submit(2)])).rejects.toThrow('database down');
    fail = false;
    expect(await group.submit(3)).toBe(3);
  });

  it('commits a batch again in halves when PostgreSQL refused a value, so only its owner fails', async () => {
    const batches: number[][] = [];
    const group = new GroupCommit<number, number>(async (batch) => {
      batches.push(batch);
      // 13 stands for a value the database refuses (class 22: a NUL byte, an overflow…).
      if (batch.includes(13)) throw Object.assign(new Error('invalid byte sequence'), { code: '22021' });
      return batch.map((n) => n * 2);
    });
    const results = await Promise.allSettled([11, 12, 13, 14].map((n) => group.submit(n)));
    expect(results.map((r) => (r.status === 'fulfilled' ? r.value : (r.reason as { code: string }).code))).toEqual([
      22,
      24,
      '22021',
      28,
    ]);
    expect(batches).toEqual([[11, 12, 13, 14], [11, 12], [13, 14], [13], [14]]);
  });

  // Issue 42: a 3,000-character tool id failed whole batches (54000), other tenants' calls with them.
  it.each([
    ['22021', 'a NUL byte'],
    ['22P05', 'an escape jsonb cannot hold'],
    ['54000', 'an index row larger than a btree page'],
    ['23514', 'a check constraint'],
    ['23505', 'a unique key'],
    ['21000', 'two rows of one statement on one key'],
  ])('fails only the members whose values PostgreSQL refused (%s, %s)', async (code) => {
    const bad = new Set([3, 17, 18, 40]);
    let commits = 0;
    const group = new GroupCommit<number, number>(async (batch) => {
      commits += 1;
      if (batch.some((n) => bad.has(n))) throw Object.assign(new Error('refused'), { code });
      return batch;
    });
    const members = Array.from({ length: 64 }, (_, i) => i);
    const results = await Promise.allSettled(members.map((n) => group.submit(n)));
    expect(results.map((r) => r.status === 'fulfilled')).toEqual(members.map((n) => !bad.has(n)));
    for (const n of bad) expect((results[n] as PromiseRejectedResult).reason).toMatchObject({ code });
    // Bisected, not one by one: a few commits for each bad member.
    expect(commits).toBeLessThan(4 * 2 * Math.log2(64) + 1);
  });

  it.each([['08006'], ['57P01'], ['53300'], ['57014']])(
    'fails the whole batch closed on a connection or resource fault (%s), without retrying',
    async (code) => {
      let calls = 0;
      const group = new GroupCommit<number, number>(async () => {
        calls += 1;
        throw Object.assign(new Error('connection lost'), { code });
      });
      const results = await Promise.allSettled([1, 2, 3].map((n) => group.submit(n)));
      expect(results.every((r) => r.status === 'rejected' && (r.reason as { code: string }).code === code)).toBe(true);
      expect(calls).toBe(1);
    },
  );

  it('commits again apart the members a partly committed batch failed for one bad value', async () => {
    // A commit that answers a group of members `Failed` together (a rate bucket, the reservations beside committed
    // closes) when one of them carried the bad value: the others go again without it.
    const batches: number[][] = [];
    const group = new GroupCommit<number, number>(async (batch) => {
      batches.push(batch);
      const refused = batch.includes(5) ? Object.assign(new Error('too long'), { code: '54000' }) : undefined;
      return batch.map((n) => (n % 2 === 1 && refused ? new Failed(refused) : n));
    });
    const results = await Promise.allSettled([1, 2, 3, 4, 5, 6].map((n) => group.submit(n)));
    expect(results.map((r) => r.status)).toEqual([
      'fulfilled',
      'fulfilled',
      'fulfilled',
      'fulfilled',
      'rejected',
      'fulfilled',
    ]);
    expect(batches[0]).toEqual([1, 2, 3, 4, 5, 6]);
    expect(batches[1]).toEqual([1, 3, 5]);
  });

  it('does not retry a batch that failed for any other reason', async () => {
    let calls = 0;
    const group = new GroupCommit<number, number>(async () => {
      calls += 1;
      throw Object.assign(new Error('deadlock'), { code: '40P01' });
    });
    const results = await Promise.allSettled([1, 2, 3].map((n) => group.submit(n)));
    expect(results.every((r) => r.status === 'rejected')).toBe(true);
    expect(calls).toBe(1);
  });

  it('rejects only the requests a partly committed batch answers with Failed', async () => {
    const group = new GroupCommit<number, number>(async (batch) =>
      batch.map((n) => (n === 2 ? new Failed(new Error('not this one')) : n)),
    );
    const results = await Promise.allSettled([1, 2, 3].map((n) => group.submit(n)));
    expect(results.map((r) => r.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((results[1] as PromiseRejectedResult).reason).toMatchObject({ message: 'not this one' });
  });
});
