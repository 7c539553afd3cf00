/**
 * Issue 33, finding 3 (server-side request forgery), through the built CLI: a client's `kv_transfer_params`
 * (`remote_host`, `remote_port`) must not make a server call wherever they point. vLLM honours them only on an
 * instance configured for PD (vllm-wire-reference.md §7); mocker's decode engines pull only from the prefill
 * engines they are told of, and a hold is freed only by whom its random id was given to.
 */
import http from 'node:http';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';
import { afterEach, describe, expect, it } from 'vitest';
import { freePorts } from '../support/kvEventsClient.js';
import { listenOnLoopback, type LoopbackServer } from '../support/loopback.js';
import { mockerProcesses } from '../support/mockerProcess.js';
import { MODEL } from '../support/vllmUpstream.js';

type Json = Record<string, unknown>;

const mockers = mockerProcesses();
const servers: LoopbackServer[] = [];
afterEach(async () => {
  await mockers.stopAll();
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

const COMMON = ['--mode', 'simulate', '--captures', ':memory:', '--timing', 'none', '--block-size', '16'];

const mocker = (args: string[]) => mockers.start(['serve', ...COMMON, ...args]);

/** A loopback server that records every request it gets (the host a forged request would reach) and answers 404. */
async function victim(): Promise<{ port: number; seen: string[] }> {
  const seen: string[] = [];
  const server = await listenOnLoopback(
    http.createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      req.resume();
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"detail":"Not Found"}');
    }),
  );
  servers.push(server);
  return { port: server.port, seen };
}

const prompt = (from: number) => Array.from({ length: 40 }, (_, i) => from + i);

function complete(url: string, body: Json): Promise<Response> {
  return fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, max_tokens: 3, ...body }),
  });
}

/** `kv_transfer_params` asking the server to pull from `host:port`, as a decode hop's would. */
const pullFrom = (host: string, port: number) => ({
  do_remote_prefill: true,
  do_remote_decode: false,
  remote_block_ids: [1, 2, 3],
  remote_engine_id: 'e',
  remote_request_id: 'r',
  remote_host: host,
  remote_port: port,
  tp_size: 1,
});

async function counter(url: string, name: string, reason?: string): Promise<number> {
  const families = parsePrometheusTextFormat(await (await fetch(`${url}/metrics`)).text());
  const sample = families.find((f) => f.name === name)?.metrics.find((m) => reason === undefined || m.labels?.reason === reason);
  if (!sample) throw new Error(`no ${name}${reason ? `{reason="${reason}"}` : ''}`);
  return Number(sample.value);
}

describe("issue 33 finding 3: kv_transfer_params make no request to a host of the client's choosing", () => {
  it('an aggregated serve (the default) follows none: no request reaches the named host:port, nor a path smuggled in remote_host', async () => {
    const target = await victim();
    const { url } = await mocker([]);
    for (const host of ['127.0.0.1', `127.0.0.1:${target.port}/steal?x=`]) {
      const res = await complete(url, { prompt: prompt(100), kv_transfer_params: pullFrom(host, target.port) });
      expect(res.status).toBe(200);
      // vLLM without a KV connector: nothing held, nothing to hand over.
      expect(((await res.json()) as Json).kv_transfer_params).toBeNull();
      // The pull would have been made before the answer: nothing came.
      expect(target.seen, host).toEqual([]);
    }
    // A hold asked of an aggregated engine is not made either: it answers as to any request.
    const held = await complete(url, { prompt: prompt(200), max_tokens: 1, kv_transfer_params: { do_remote_decode: true } });
    expect(((await held.json()) as Json).kv_transfer_params).toBeNull();
  });

  it('a decode engine pulls only from --kv-transfer-allowed-hosts: other hosts are never called, open or closed ports alike', async () => {
    const target = await victim();
    const [closedPort] = await freePorts(1);
    const prefill = await mocker(['--disaggregation-mode', 'prefill']);
    const prefillPort = Number(new URL(prefill.url).port);
    const decode = await mocker(['--disaggregation-mode', 'decode', '--kv-transfer-allowed-hosts', `127.0.0.1:${prefillPort}`]);
    for (const [host, port] of [
      ['127.0.0.1', target.port],
      ['127.0.0.1', closedPort],
      [`127.0.0.1:${target.port}/steal?x=`, prefillPort],
      ['localhost', prefillPort],
    ] as const) {
      const res = await complete(decode.url, { prompt: prompt(300), kv_transfer_params: pullFrom(host, port) });
      // Recomputed locally, as any failed pull (vLLM's kv_load_failure_policy "recompute").
      expect(res.status).toBe(200);
      expect(((await res.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens).toBe(3);
    }
    expect(target.seen).toEqual([]);
    expect(await counter(decode.url, 'mocker_kv_pull_failures_total', 'peer_not_allowed')).toBe(4);
    expect(await counter(decode.url, 'mocker_kv_pull_failures_total', 'unreachable')).toBe(0);
    expect(await counter(decode.url, 'mocker_kv_pull_failures_total', 'unknown_blocks')).toBe(0);
    // The log says the same of an open port and a closed one (nothing was tried): which ports are open stays unknown.
    const lines = decode
      .stderr()
      .split('\n')
      .filter((l) => l.includes('KV pull failed'));
    expect(lines).toHaveLength(4);
    expect(lines[0].replace(String(target.port), 'PORT')).toBe(lines[1].replace(String(closedPort), 'PORT'));

    // The allowed prefill engine is pulled from, and its hold freed.
    const p = await complete(prefill.url, { prompt: prompt(400), max_tokens: 1, kv_transfer_params: { do_remote_decode: true } });
    const kv = ((await p.json()) as { kv_transfer_params: Json }).kv_transfer_params;
    expect(kv).toMatchObject({ remote_host: '127.0.0.1', remote_port: prefillPort });
    expect((await complete(decode.url, { prompt: prompt(400), kv_transfer_params: kv })).status).toBe(200);
    expect(await counter(decode.url, 'mocker_kv_pulls_total')).toBe(1);
  });

  it('a hold is named by a random id: the ids are unrelated uuids, and a guessed id frees nothing', async () => {
    const prefill = await mocker(['--disaggregation-mode', 'prefill']);
    const hold = async (from: number) =>
      (
        (await (await complete(prefill.url, { prompt: prompt(from), max_tokens: 1, kv_transfer_params: { do_remote_decode: true } })).json()) as {
          kv_transfer_params: Json;
        }
      ).kv_transfer_params;
    const first = await hold(500);
    const second = await hold(600);
    for (const kv of [first, second]) expect(kv.remote_request_id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(first.remote_request_id).not.toBe(second.remote_request_id);
    const activeBlocks = async () =>
      ((await (await fetch(`${prefill.url}/mocker/engine`)).json()) as { ranks: { activeBlocks: number }[] }).ranks[0].activeBlocks;
    const held = await activeBlocks();
    expect(held).toBe(6);
    // Another client knows the engine id (it is in every prefill answer) and tries the ids a counter would give.
    const release = (requestId: string) =>
      fetch(`${prefill.url}/mocker/kv_transfer/pull`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ remote_engine_id: first.remote_engine_id, remote_request_id: requestId }),
      });
    for (const guess of ['0.0', '0.1', '0.2', '1', '0']) expect((await release(guess)).status, guess).toBe(404);
    expect(await activeBlocks()).toBe(held);
    // Whoever was given the id frees the hold, once.
    expect((await release(first.remote_request_id as string)).status).toBe(200);
    expect((await release(first.remote_request_id as string)).status).toBe(404);
    expect(await activeBlocks()).toBe(held - 3);
  });
});
