/**
 * `npm ci` on a clean clone installs without warnings on every Node the project supports: no dependency asks for
 * a newer Node (npm's EBADENGINE warning) and every install script in the lockfile is approved or refused in
 * `allowScripts` (npm's "install scripts not yet covered" warning). Read from the lockfile npm installs from.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import semver from 'semver';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..', '..');
const project = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string }; allowScripts: Record<string, boolean> };
const lock = JSON.parse(readFileSync(join(ROOT, 'package-lock.json'), 'utf8')) as {
  packages: Record<string, { engines?: { node?: string }; hasInstallScript?: boolean }>;
};
const installed = Object.entries(lock.packages).filter(([path]) => path !== '');
const packageName = (path: string) => path.slice(path.lastIndexOf('node_modules/') + 'node_modules/'.length);

describe('npm ci on a clean clone', () => {
  const oldestSupported = semver.minVersion(project.engines.node)!.version;

  it.each([
    ['the oldest Node the project supports', oldestSupported],
    ['the Node running the tests', process.versions.node],
  ])('no dependency requires a newer Node than %s (no EBADENGINE)', (_, node) => {
    expect(semver.satisfies(process.versions.node, project.engines.node)).toBe(true);
    const unsupported = installed
      .filter(([, entry]) => entry.engines?.node !== undefined && !semver.satisfies(node, entry.engines.node))
      .map(([path, entry]) => `${packageName(path)} needs node ${entry.engines?.node}`);
    expect(unsupported).toEqual([]);
  });

  it('every install script is approved or refused in allowScripts (no install-scripts warning)', () => {
    const withScripts = installed.filter(([, entry]) => entry.hasInstallScript).map(([path]) => packageName(path));
    expect(withScripts.length).toBeGreaterThan(0);
    expect(withScripts.filter((name) => !(name in project.allowScripts))).toEqual([]);
  });
});
