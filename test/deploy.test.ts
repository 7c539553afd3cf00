/**
 * The Helm chart (deploy/helm/mocker) and the plain manifests (deploy/k8s): every manifest rendered for each
 * values file in ci/ is valid Kubernetes (kubernetes-models' schemas, Kubernetes 1.27; the ServiceMonitor
 * against prometheus-operator's CRD), and wired as the README says: ports, probes, env, the read-only capture
 * mount, the PD proxy pointing at the prefill and decode Services, KV event ports per pod. Rendered by
 * test/support/helmTemplate.ts (no helm binary here), whose Go template semantics are checked first.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse, parseAllDocuments } from 'yaml';
import { Deployment } from 'kubernetes-models/apps/v1';
import { ConfigMap, Service } from 'kubernetes-models/v1';
import type { IContainer, IEnvVar } from 'kubernetes-models/v1';
import { ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { loadChart, renderChart, TemplateError } from './support/helmTemplate.js';

const ROOT = join(import.meta.dirname, '..');
const CHART_DIR = join(ROOT, 'deploy', 'helm', 'mocker');
const chart = loadChart(CHART_DIR);

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- manifests are plain parsed YAML, checked by the schemas below
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

/** `helm template mocker deploy/helm/mocker -f VALUES`, every document validated. */
function render(values: Manifest = {}): Manifest[] {
  const docs = [...renderChart(chart, { releaseName: 'mocker', namespace: 'default', values }).values()].flatMap(documents);
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
const ciValues = (file: string) => parse(readFileSync(join(CHART_DIR, 'ci', file), 'utf8')) as Manifest;

describe('the test renderer follows Go templates and Sprig, and refuses what it does not know', () => {
  const one = (source: string, values: Manifest = {}) =>
    [...renderChart({ metadata: { name: 'c', version: '1' }, values, templates: [{ name: 'c/templates/t.yaml', source }] }, { releaseName: 'r', namespace: 'n' }).values()].join('');

  it('trim markers, sorted map ranges, else if, default, quote, nindent', () => {
    expect(one('a  {{- " b " -}}  c')).toBe('a b c');
    expect(one('{{ range $k, $v := .Values.m }}{{ $k }}={{ $v }};{{ end }}', { m: { b: 2, a: 1 } })).toBe('a=1;b=2;');
    expect(one('{{ if eq .Values.x "p" }}P{{ else if eq .Values.x "q" }}Q{{ else }}R{{ end }}', { x: 'q' })).toBe('Q');
    expect(one('{{ default 5 .Values.missing }} {{ default 5 .Values.zero }} {{ .Values.n | quote }}', { zero: 0, n: 8000 })).toBe('5 5 "8000"');
    expect(one('x:{{ "a: 1\\nb: 2" | nindent 2 }}')).toBe('x:\n  a: 1\n  b: 2');
  });

  it("Go's types: a float64 from values is no int, an int64 from add is no int", () => {
    expect(() => one('{{ eq .Values.n 1 }}', { n: 1 })).toThrow(/incompatible types/);
    expect(() => one('{{ printf "%d" .Values.n }}', { n: 1 })).toThrow(/%d of a float64/);
    expect(() => one('{{ range until (add 1 1) }}{{ end }}')).toThrow(/wants an int, got int64/);
    expect(one('{{ printf "%d" (int .Values.n) }} {{ add .Values.n 2 }}', { n: 3 })).toBe('3 5');
    expect(() => one('{{ .Values.big }}', { big: 1000000 })).toThrow(/exponent form/);
  });

  it('unknown functions and constructs fail loudly', () => {
    expect(() => one('{{ sha256sum "x" }}')).toThrow(TemplateError);
    expect(() => one('{{ template "x" . }}')).toThrow(/not supported/);
    expect(() => one('{{ .Values.a.b }}')).toThrow(/nil pointer/);
  });

  it('the schemas catch a malformed manifest', () => {
    expect(() => validate({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'x' }, spec: { ports: [{ port: 'http' }] } })).toThrow(/must be integer/);
  });
});

describe('the chart, rendered for each values file in ci/', () => {
  it('ci/ holds the four layouts, each rendering valid manifests with unique names', () => {
    const files = readdirSync(join(CHART_DIR, 'ci')).sort();
    expect(files).toEqual(['agg-replay-values.yaml', 'agg-simulate-values.yaml', 'disagg-values.yaml', 'kv-events-values.yaml']);
    for (const file of files) {
      const docs = render(ciValues(file));
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

  it('agg-replay: the ConfigMap mounted read-only at /captures, MOCKER_CAPTURES naming its file', () => {
    const docs = render(ciValues('agg-replay-values.yaml'));
    const engine = find(docs, 'Deployment', 'mocker-engine');
    const c = container(engine);
    expect(env(c)).toMatchObject({ MOCKER_CAPTURES: '/captures/golden.db', MOCKER_MODE: 'replay', MOCKER_ON_MISS: 'error', MOCKER_SPEEDUP_RATIO: '2' });
    expect(c.volumeMounts).toContainEqual({ name: 'captures', mountPath: '/captures', readOnly: true });
    expect(engine.spec.template.spec.volumes).toContainEqual({ name: 'captures', configMap: { name: 'mocker-captures' } });
  });

  it('disagg 2P4D: prefill and decode Deployments, the PD proxy pointing at their Services, KV pulled from the prefill pod itself', () => {
    const docs = render(ciValues('disagg-values.yaml'));
    const prefill = find(docs, 'Deployment', 'mocker-prefill');
    const decode = find(docs, 'Deployment', 'mocker-decode');
    const proxy = find(docs, 'Deployment', 'mocker-pd-proxy');
    expect([prefill.spec.replicas, decode.spec.replicas, proxy.spec.replicas]).toEqual([2, 4, 2]);
    expect(env(container(prefill))).toMatchObject({ MOCKER_DISAGGREGATION_MODE: 'prefill', MOCKER_MAX_NUM_BATCHED_TOKENS: '16384', MOCKER_KV_TRANSFER_BANDWIDTH: '32' });
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
    for (const [role, deployment] of [['PREFILL', prefill], ['DECODE', decode]] as const) {
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
    expect(JSON.parse(env(c).MOCKER_KV_EVENTS_CONFIG!)).toEqual({ enable_kv_cache_events: true, publisher: 'zmq', endpoint: 'tcp://*:5557', replay_endpoint: 'tcp://*:5600' });
    // 2 workers x 2 ranks (README: worker w's ports offset by w x DP size, rank r by r): 5557..5560, 5600..5603.
    const ports = Object.fromEntries(c.ports!.map((x) => [x.name, x.containerPort]));
    expect(ports).toEqual({
      http: 8000, 'http-1': 8001,
      'kv-0': 5557, 'kv-1': 5558, 'kv-2': 5559, 'kv-3': 5560,
      'kv-replay-0': 5600, 'kv-replay-1': 5601, 'kv-replay-2': 5602, 'kv-replay-3': 5603,
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
    Array.isArray(v) ? v.map(withoutHelmLabels) : v !== null && typeof v === 'object' ? Object.fromEntries(Object.entries(v).filter(([k]) => !HELM_LABELS.includes(k)).map(([k, x]) => [k, withoutHelmLabels(x)])) : v;
  const optionalCaptures = { volume: { configMap: { name: 'mocker-captures', optional: true } } };

  it.each([
    ['aggregated.yaml', { engine: { replicas: 2 }, captures: optionalCaptures }],
    ['disaggregated.yaml', { mode: 'disaggregated', captures: optionalCaptures }],
  ])('%s: valid, and the chart rendered with its values (less the Helm labels)', (file, values) => {
    const plain = documents(readFileSync(join(ROOT, 'deploy', 'k8s', file), 'utf8'));
    plain.forEach(validate);
    expect(plain).toEqual(render(values).map(withoutHelmLabels));
  });
});
