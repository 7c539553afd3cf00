/**
 * The import rules (`npm run lint:deps`: scripts/lint-deps.mjs with .dependency-cruiser.cjs) fail on what they
 * forbid. Each case is a tiny src/ tree in a temporary directory, checked by the script as `npm test` runs it;
 * the expected rule names and module pairs are read off the tree's own imports.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { testTmpdir } from '../support/tempRoot.js';

const SCRIPT = fileURLToPath(new URL('../../scripts/lint-deps.mjs', import.meta.url));

/** Runs the check in a directory holding these files (path under it → source). */
function lintDeps(files: Record<string, string>): { status: number | null; stdout: string; stderr: string } {
  const dir = mkdtempSync(join(testTmpdir(), 'mocker-import-rules-'));
  for (const [path, source] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), { recursive: true });
    writeFileSync(join(dir, path), source);
  }
  const run = spawnSync(process.execPath, [SCRIPT], { cwd: dir, encoding: 'utf8' });
  return { status: run.status, stdout: run.stdout, stderr: run.stderr };
}

describe('npm run lint:deps', () => {
  it('fails on an import from a higher layer, on a cycle made of a type-only import, and on a folder with no layer', () => {
    const run = lintDeps({
      // wire sits below http, and the type-only import closes a cycle with http/server.ts's import.
      'src/wire/errors.ts': "import type { Server } from '../http/server.js';\nexport const errorBody = (s: Server) => s.name;\n",
      'src/http/server.ts': "import { errorBody } from '../wire/errors.js';\nexport interface Server { name: string }\nexport const body = errorBody;\n",
      'src/misc/thing.ts': "import { body } from '../http/server.js';\nexport const thing = body;\n",
    });
    expect(run.status).toBe(1);
    expect(run.stdout).toMatch(/error no-upward-import: src\/wire\/errors\.ts → src\/http\/server\.ts/);
    expect(run.stdout).toMatch(/error no-circular: src\/(wire\/errors|http\/server)\.ts/);
    expect(run.stdout).toMatch(/error folder-without-layer: src\/misc\/thing\.ts → src\/http\/server\.ts/);
    // The import downwards (http → wire) is not an upward one.
    expect(run.stdout).not.toMatch(/no-upward-import: src\/http\/server\.ts/);
  });

  it('fails when it cruised too few modules to be checking anything, even with no violation', () => {
    const run = lintDeps({
      'src/util/clock.ts': 'export const zero = 0;\n',
      'src/engine/core.ts': "import { zero } from '../util/clock.js';\nexport const start = zero;\n",
    });
    expect(run.stdout).toMatch(/no dependency violations found \(2 modules/);
    expect(run.stderr).toMatch(/only 2 modules cruised, expected at least 100/);
    expect(run.status).toBe(1);
  });
});
