/**
 * How long a closing replica waits for each step that needs the database: in a silent partition no answer comes, and
 * the client's own query timeout outlasts shutdown. A step given up goes on until its connection is destroyed.
 */
export const CLOSE_STEP_WAIT_MS = 1_000;

/** Waits for `work` to settle, at most `ms`: whether it did. Its outcome is not reported either way. */
export async function waitAtMost(
  work: Promise<unknown> | undefined,
  ms: number = CLOSE_STEP_WAIT_MS,
): Promise<boolean> {
  if (work === undefined) return true;
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([
      work.then(
        () => true,
        () => true,
      ),
      timedOut,
    ]);
  } finally {
    clearTimeout(timer);
  }
}
