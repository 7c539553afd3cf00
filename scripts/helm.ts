/** `npm run helm -- ARGS`: the real helm (scripts/helmBinary.ts) with those arguments, its exit status passed on. */
import { spawnSync } from 'node:child_process';
import { helmBinary } from './helmBinary.js';

const result = spawnSync(helmBinary(), process.argv.slice(2), { stdio: 'inherit' });
if (result.error) throw result.error;
process.exit(result.status ?? 1);
