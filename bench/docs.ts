/**
 * Regenerates the benchmark tables of docs/benchmarks.md (all figures) and README.md (the figures with a target)
 * from a results file of `npm run bench` (its last run):
 *   npm run bench:docs -- bench/results/<date>.jsonl
 * Only the text between each file's marker comments (bench/lib/report.ts) is rewritten.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { replaceBetweenMarkers } from '../scripts/generatedBlock.js';
import { HEADLINE_BLOCK, headlineSection, lastRun, TABLE_BLOCK, tableSection } from './lib/report.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const file = process.argv[2];
if (!file) {
  console.error('usage: npm run bench:docs -- bench/results/<date>.jsonl');
  process.exit(2);
}
const resultsPath = relative(ROOT, resolve(file));
const results = lastRun(readFileSync(file, 'utf8'));
for (const [path, block, section] of [
  ['docs/benchmarks.md', TABLE_BLOCK, tableSection(results, resultsPath)],
  ['README.md', HEADLINE_BLOCK, headlineSection(results, resultsPath)],
] as const) {
  const target = resolve(ROOT, path);
  writeFileSync(target, replaceBetweenMarkers(readFileSync(target, 'utf8'), block, section));
  console.log(`${path}: benchmark table regenerated from ${resultsPath}`);
}
