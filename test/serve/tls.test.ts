/**
 * TLS on every server (issue 33), through the built CLI: vLLM's `--ssl-keyfile` / `--ssl-certfile` (uvicorn's,
 * with `--ssl-ca-certs` / `--ssl-cert-reqs` for client certificates), and the capture proxy reaching an https
 * upstream whose certificate it checks against `--upstream-ca-certs`. The certificates are made here by
 * `openssl`: a CA of our own, a server certificate for 127.0.0.1 and a client certificate, all signed by it. The
 * oracles are the official `openai` client (in a child process trusting the CA through NODE_EXTRA_CA_CERTS) and
 * Node's own TLS client.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CaptureStore } from '../../src/store/captureStore.js';
import { mockerProcesses } from '../support/mockerProcess.js';
import { testTmpdir } from '../support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..', '..');
/** The environment without the variables that stand in for flags or add trusted CAs. */
const ENV = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(VLLM_|MOCKER_|NODE_EXTRA_CA_CERTS$)/.test(k)));

let dir: string;
const pem = (name: string) => join(dir, name);

/** A CA, a server (SAN 127.0.0.1, localhost) and a client certificate it signed, and a self-signed client one: EC keys, valid for a day. */
function makeCertificates(): void {
  const openssl = (...args: string[]) => execFileSync('openssl', args, { cwd: dir, stdio: 'pipe' });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  openssl(
    'req',
    '-x509',
    ...ec,
    '-keyout',
    'ca.key',
    '-out',
    'ca.pem',
    '-days',
    '1',
    '-subj',
    '/CN=mocker test CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  );
  for (const [name, usage, san] of [
    ['server', 'serverAuth', 'subjectAltName=IP:127.0.0.1,DNS:localhost'],
    ['client', 'clientAuth', 'subjectAltName=DNS:client'],
  ]) {
    openssl('req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=mocker test ${name}`);
    writeFileSync(join(dir, `${name}.ext`), `${san}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=${usage}\n`);
    openssl(
      'x509',
      '-req',
      '-in',
      `${name}.csr`,
      '-CA',
      'ca.pem',
      '-CAkey',
      'ca.key',
      '-CAcreateserial',
      '-out',
      `${name}.pem`,
      '-days',
      '1',
      '-extfile',
      `${name}.ext`,
    );
  }
  openssl('req', '-x509', ...ec, '-keyout', 'rogue.key', '-out', 'rogue.pem', '-days', '1', '-subj', '/CN=mocker rogue client');
}

beforeAll(() => {
  dir = mkdtempSync(join(testTmpdir(), 'mocker-tls-'));
  makeCertificates();
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const mockers = mockerProcesses();
afterEach(mockers.stopAll);

const SERVER_TLS = () => ['--ssl-keyfile', pem('server.key'), '--ssl-certfile', pem('server.pem')];
const SERVE = ['serve', '--mode', 'random', '--fast', '--served-model-name', 'm'];

const mocker = (args: string[]) => mockers.start(args, { env: ENV });

/** What the official openai client gets from `baseURL` (also its models, `listModels`), run in a child process trusting `ca` if given. */
async function openaiClient(
  baseURL: string,
  ca?: string,
  listModels = true,
): Promise<{ models?: string[]; finish?: string; tokens?: number; streamed?: string; error?: string }> {
  const script = `
    import OpenAI from 'openai';
    const client = new OpenAI({ baseURL: process.env.BASE_URL, apiKey: 'sk-tls', maxRetries: 0 });
    try {
      const models = process.env.LIST_MODELS ? (await client.models.list()).data.map((m) => m.id) : undefined;
      const chat = await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4 });
      let streamed = '';
      for await (const chunk of await client.chat.completions.create({ model: 'm', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, stream: true })) streamed += chunk.choices[0]?.delta?.content ?? '';
      console.log(JSON.stringify({ models, finish: chat.choices[0].finish_reason, tokens: chat.usage.completion_tokens, streamed }));
    } catch (err) {
      console.log(JSON.stringify({ error: String(err.cause?.cause?.code ?? err.cause?.code ?? err.message) }));
    }`;
  const env = { ...ENV, BASE_URL: baseURL, ...(listModels ? { LIST_MODELS: '1' } : {}), ...(ca ? { NODE_EXTRA_CA_CERTS: ca } : {}) };
  const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { cwd: ROOT, env });
  return JSON.parse(stdout) as { models?: string[]; error?: string };
}

/** A GET with Node's TLS client trusting our CA (presenting the named client certificate, if any). */
function httpsGet(url: string, clientCert?: 'client' | 'rogue'): Promise<{ status: number; body: string }> {
  const options: https.RequestOptions = {
    ca: readFileSync(pem('ca.pem')),
    ...(clientCert ? { cert: readFileSync(pem(`${clientCert}.pem`)), key: readFileSync(pem(`${clientCert}.key`)) } : {}),
  };
  return new Promise((resolve, reject) => {
    https
      .get(url, options, (res) => {
        let body = '';
        res
          .setEncoding('utf8')
          .on('data', (d: string) => (body += d))
          .on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      })
      .on('error', reject);
  });
}

describe('serve over TLS', () => {
  it('a serve with --ssl-keyfile/--ssl-certfile answers the openai client that trusts the CA (models, chat, stream); one that does not is refused', async () => {
    const server = await mocker([...SERVE, ...SERVER_TLS()]);
    expect(server.stdout()).toMatch(new RegExp(`on https://127\\.0\\.0\\.1:${server.port}\\b`));
    const baseURL = `https://127.0.0.1:${server.port}/v1`;
    const trusted = await openaiClient(baseURL, pem('ca.pem'));
    expect(trusted).toMatchObject({ models: ['m'], finish: 'length', tokens: 4 });
    expect(trusted.streamed!.length).toBeGreaterThan(0);
    const untrusted = await openaiClient(baseURL);
    expect(untrusted.models).toBeUndefined();
    // OpenSSL's verdict on a chain it cannot trace to a CA it knows.
    expect(untrusted.error).toMatch(/^(UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT_LOCALLY|SELF_SIGNED_CERT_IN_CHAIN)$/);
    // Plain HTTP on the TLS port gets no answer of the API.
    await expect(fetch(`http://127.0.0.1:${server.port}/health`)).rejects.toThrow();
  });

  it('--ssl-ca-certs with --ssl-cert-reqs 2: a client must present a certificate the CA signed; with 1 it may present none, not a bad one', async () => {
    const required = await mocker([...SERVE, ...SERVER_TLS(), '--ssl-ca-certs', pem('ca.pem'), '--ssl-cert-reqs', '2']);
    const url = `https://127.0.0.1:${required.port}/health`;
    expect((await httpsGet(url, 'client')).status).toBe(200);
    await expect(httpsGet(url)).rejects.toThrow();
    await expect(httpsGet(url, 'rogue')).rejects.toThrow();
    const optional = await mocker([...SERVE, ...SERVER_TLS(), '--ssl-ca-certs', pem('ca.pem'), '--ssl-cert-reqs', '1']);
    const optionalUrl = `https://127.0.0.1:${optional.port}/health`;
    expect((await httpsGet(optionalUrl, 'client')).status).toBe(200);
    expect((await httpsGet(optionalUrl)).status).toBe(200);
    await expect(httpsGet(optionalUrl, 'rogue')).rejects.toThrow();
  });
});

describe('capture and pd-proxy over TLS', () => {
  it('capture --upstream https://… --upstream-ca-certs: a TLS serve is identified and captured; without the CA the upstream is refused', async () => {
    const upstream = await mocker([...SERVE, ...SERVER_TLS()]);
    const upstreamUrl = `https://127.0.0.1:${upstream.port}`;
    const captures = pem('tls-upstream.db');
    const capture = await mocker(['capture', '--upstream', upstreamUrl, '--upstream-ca-certs', pem('ca.pem'), '--captures', captures, ...SERVER_TLS()]);
    expect(capture.stdout()).toMatch(new RegExp(`proxying https://127\\.0\\.0\\.1:${capture.port}\\b`));
    // The capture proxy serves TLS itself too: the openai client trusting the CA goes through it.
    const answered = await openaiClient(`https://127.0.0.1:${capture.port}/v1`, pem('ca.pem'));
    expect(answered).toMatchObject({ models: ['m'], finish: 'length', tokens: 4 });
    await capture.stop();
    const store = CaptureStore.open(captures, { readonly: true });
    try {
      // Identified through TLS (its /version and /v1/models), and both chats (plain and streamed) recorded whole.
      expect(store.latestRun()).toMatchObject({ kind: 'capture', upstream: `${upstreamUrl}/`, engine: 'vllm' });
      expect(store.contents().outcomes).toMatchObject({ complete: 2, failed: 0, aborted: 0 });
    } finally {
      store.close();
    }

    const untrusting = await mocker(['capture', '--upstream', upstreamUrl, '--captures', pem('untrusted.db')]);
    const refused = await fetch(`http://127.0.0.1:${untrusting.port}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'm', prompt: 'Hi', max_tokens: 2 }),
    });
    expect(refused.status).toBe(502);
    expect(((await refused.json()) as { error: { message: string } }).error.message).toMatch(/certificate/i);
  });

  it('pd-proxy with --ssl-keyfile/--ssl-certfile answers over TLS', async () => {
    const prefill = await mocker([...SERVE, '--disaggregation-mode', 'prefill']);
    const decode = await mocker([...SERVE, '--disaggregation-mode', 'decode', '--kv-transfer-allowed-hosts', `127.0.0.1:${prefill.port}`]);
    const proxy = await mocker(['pd-proxy', '--prefill', `http://127.0.0.1:${prefill.port}`, '--decode', `http://127.0.0.1:${decode.port}`, ...SERVER_TLS()]);
    expect(proxy.stdout()).toMatch(new RegExp(`on https://127\\.0\\.0\\.1:${proxy.port}\\b`));
    expect(JSON.parse((await httpsGet(`https://127.0.0.1:${proxy.port}/healthcheck`)).body)).toEqual({
      status: 'ok',
      prefill_instances: 1,
      decode_instances: 1,
    });
    // The proxy serves the two generation routes only (vLLM's toy proxy): no model list.
    expect(await openaiClient(`https://127.0.0.1:${proxy.port}/v1`, pem('ca.pem'), false)).toMatchObject({ finish: 'length', tokens: 4 });
  });
});
