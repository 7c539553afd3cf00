/**
 * Regenerates README.md's benchmark table from a results file of `npm run bench` (its last run):
 *   npm run bench:readme -- bench/results/<date>.jsonl
 * Only the text between the two marker comments (bench/lib/report.ts) is rewritten.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { lastRun, readmeSection, replaceBetweenMarkers } from './lib/report.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const file = process.argv[2];
if (!file) {
  console.error('usage: npm run bench:readme -- bench/results/<date>.jsonl');
  process.exit(2);
}
const resultsPath = relative(ROOT, resolve(file));
const readmePath = resolve(ROOT, 'README.md');
const section = readmeSection(lastRun(readFileSync(file, 'utf8')), resultsPath);
writeFileSync(readmePath, replaceBetweenMarkers(readFileSync(readmePath, 'utf8'), section));
console.log(`README.md: benchmark table regenerated from ${resultsPath}`);
