/**
 * Writes docs/client-matrix.md from a run of the client matrix (test/clients/client-matrix.test.ts), read from vitest's
 * JSON reporter. Run after building: `npx tsc -p . && npx tsx scripts/client-matrix.ts`.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { renderMatrixDoc, TARGETS, type Outcome, type Target } from '../test/support/clientMatrix.js';

/** The part of vitest's JSON report read here. */
interface VitestReport {
  testResults: { assertionResults: { ancestorTitles: string[]; title: string; status: string; failureMessages: string[] }[] }[];
}

const root = join(import.meta.dirname, '..');
const directory = mkdtempSync(join(tmpdir(), 'mocker-client-matrix-'));
try {
  const reportPath = join(directory, 'report.json');
  // The run fails while a cell fails: its report is still complete.
  spawnSync('npx', ['vitest', 'run', 'test/clients/client-matrix.test.ts', '--reporter=json', `--outputFile=${reportPath}`], { cwd: root, stdio: 'inherit' });
  const report = JSON.parse(readFileSync(reportPath, 'utf8')) as VitestReport;
  const outcomes = Object.fromEntries(TARGETS.map((target) => [target, {} as Record<string, Outcome>])) as Record<Target, Record<string, Outcome>>;
  for (const result of report.testResults.flatMap((file) => file.assertionResults)) {
    const target = result.ancestorTitles[0] as Target;
    outcomes[target][result.title] =
      result.status === 'passed' ? { passed: true } : { passed: false, error: firstLine(result.failureMessages[0] ?? result.status) };
  }
  writeFileSync(join(root, 'docs', 'client-matrix.md'), renderMatrixDoc(outcomes));
} finally {
  rmSync(directory, { recursive: true, force: true });
}

/** An error's first line without terminal colours, short enough for a list item. */
function firstLine(message: string): string {
  // Vitest colours its messages with terminal escape codes.
  const line = message
    .replace(/\u001b\[[0-9;]*m/g, '')
    .split('\n')[0]
    .trim();
  return line.length > 200 ? `${line.slice(0, 200)}…` : line;
}
