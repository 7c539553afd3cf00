/**
 * Vitest's global setup: every test file makes its temporary directories under one root, removed when the run
 * ends (whatever the files did, or failed to do), so a run leaves nothing behind. The Hugging Face cache is an
 * empty directory there too: a developer's own cached models cannot change which tokenizer a test finds.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const ENV = 'VITEST_MOCKER_TMPDIR';

export function setup(): () => void {
  const root = mkdtempSync(join(tmpdir(), 'mocker-tests-'));
  // Test workers are started after this and inherit it.
  process.env[ENV] = root;
  process.env.HF_HOME = join(root, 'huggingface');
  mkdirSync(process.env.HF_HOME);
  delete process.env.HF_HUB_CACHE;
  return () => rmSync(root, { recursive: true, force: true });
}

/** Where tests make their temporary directories (the system's when run outside vitest's global setup). */
export function testTmpdir(): string {
  return process.env[ENV] ?? tmpdir();
}
