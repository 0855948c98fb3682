import { readFile, rename, writeFile } from 'node:fs/promises';

/** What a command kept in FILE on an earlier run (`--anchor`, `--state`), parsed; undefined before the first. */
export async function readKept(file: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw error;
  }
  return JSON.parse(text) as unknown;
}

/** Keeps a value in FILE for the next run: written aside, then renamed, so an interrupted write never leaves half of it. */
export async function keep(file: string, value: unknown): Promise<void> {
  await writeFile(`${file}.tmp`, `${JSON.stringify(value)}\n`);
  await rename(`${file}.tmp`, file);
}
