/**
 * `npm run lint:deps`: the import rules of .dependency-cruiser.cjs over ./src (of the working directory), as
 * dependency-cruiser's `err` report; fails on a violation, and when fewer than MIN_MODULES modules were cruised
 * (dependency-cruiser reports no violations, not an error, when it cannot parse the files).
 */
import { fileURLToPath } from 'node:url';
import { cruise, format } from 'dependency-cruiser';
import extractDepcruiseOptions from 'dependency-cruiser/config-utl/extract-depcruise-options';

const MIN_MODULES = 100;
const CONFIG = fileURLToPath(new URL('../.dependency-cruiser.cjs', import.meta.url));

const { output: result } = await cruise(['src'], await extractDepcruiseOptions(CONFIG));
const report = await format(result, { outputType: 'err' });
process.stdout.write(report.output);
const cruised = result.summary.totalCruised;
if (cruised < MIN_MODULES) {
  console.error(`lint:deps: only ${cruised} modules cruised, expected at least ${MIN_MODULES}: is the swc parser (@swc/core) installed?`);
  process.exitCode = 1;
} else process.exitCode = report.exitCode === 0 ? 0 : 1;
