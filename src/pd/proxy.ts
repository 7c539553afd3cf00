import { randomUUID } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { listeningServer, OWN_HEALTH_PATH, type Drain, type DrainResult } from '../wire/drain.js';
import { spliceFirstMember } from '../capture/forward.js';
import { errorJson } from '../wire/errors.js';
import { abortOnClose, answerHealthy, readBody, sendJson, sendTooLarge } from '../wire/http.js';
import { serverTls, type TlsFiles } from '../wire/tls.js';
import { admitted, decodedPath, DEFAULT_API_KEY_SCOPE, UNAUTHORIZED_BODY, type ApiKeyPolicy, type ClassifiedRoute } from '../wire/access.js';
import type { KvTransferParams } from '../api/schemas.js';
import { requestPull } from './kvTransfer.js';

export interface PdProxyOptions {
  prefill: URL[];
  decode: URL[];
  host: string;
  port: number;
  /** Largest request body accepted. */
  maxBodyBytes: number;
  /** --api-key and --api-key-scope (default: no key). */
  access?: ApiKeyPolicy;
  /** --ssl-keyfile and the rest: HTTPS (default: plain HTTP). The server of `listening` is the caller's. */
  tls?: TlsFiles;
  /** A server already listening on host:port (made by `drain`), for a caller that binds before starting engines. */
  listening?: { drain: Drain; server: Server };
}

export interface RunningProxy {
  port: number;
  /** Stops taking requests, lets those in flight finish for up to `graceMs` (default 0), closes. */
  close(graceMs?: number): Promise<DrainResult>;
}

type Json = Record<string, unknown>;

/** What the proxy asks of the prefill hop (vllm-wire-reference.md §7 step 2). */
const PREFILL_TRANSFER_PARAMS = {
  do_remote_decode: true,
  do_remote_prefill: false,
  remote_engine_id: null,
  remote_block_ids: null,
  remote_host: null,
  remote_port: null,
};

/** The prefill hop's body: a copy of the client's with one non-streamed token and the transfer request. */
export function prefillBody(body: Json): Json {
  const out: Json = { ...body, kv_transfer_params: PREFILL_TRANSFER_PARAMS, stream: false, max_tokens: 1 };
  if ('max_completion_tokens' in out) out.max_completion_tokens = 1;
  delete out.stream_options;
  delete out.min_tokens;
  delete out.min_completion_tokens;
  return out;
}

/** How long the proxy waits on a prefill engine asked to free a hold nobody will pull. */
const RELEASE_TIMEOUT_MS = 5000;

/**
 * A decode hop never sent (its client left), refused, failed or left before the decode engine answered never
 * pulls: the prefill engine would hold those blocks until its timeout (vLLM: VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
 * 480 s). Freed now, as a pull does, at the prefill engine the proxy asked (not wherever its answer points); an
 * engine without that endpoint (or no longer holding them) answers 404.
 */
function releaseUnpulled(transfer: unknown, prefill: URL, authorization: string | undefined): void {
  if (!transfer || typeof transfer !== 'object') return;
  const { remote_engine_id: engineId, remote_request_id: requestId } = transfer as KvTransferParams;
  if (typeof engineId === 'string' && typeof requestId === 'string') void requestPull(prefill, engineId, requestId, RELEASE_TIMEOUT_MS, authorization);
}

const agents = { http: new http.Agent({ keepAlive: true }), https: new https.Agent({ keepAlive: true }) };

/** Every route of the proxy, with its access class (access.ts): what `handle` answers; any other path is a 404. */
export const PD_PROXY_ROUTES: readonly ClassifiedRoute[] = [
  { method: 'GET', path: '/healthcheck', class: 'public' },
  // As an engine's (and the routers' in front of vLLM: vllm-router, SGLang's, Dynamo's frontend): 200 while serving.
  { method: 'GET', path: '/health', class: 'public' },
  { method: 'GET', path: OWN_HEALTH_PATH, class: 'public' },
  { method: 'POST', path: '/v1/completions', class: 'key' },
  { method: 'POST', path: '/v1/chat/completions', class: 'key' },
];

/** The client's request as both hops need it: its bytes, their JSON, and the prefill hop's body. */
interface ClientRequest {
  raw: Buffer;
  body: Json;
  prefillPayload: string;
}

/** The client's body, read and checked; null once the client has its error answer. */
async function readClientRequest(req: IncomingMessage, res: ServerResponse, maxBodyBytes: number): Promise<ClientRequest | null> {
  const raw = await readBody(req, maxBodyBytes);
  if (raw === null) {
    sendTooLarge(res, maxBodyBytes);
    return null;
  }
  try {
    const parsed: unknown = JSON.parse(raw.toString('utf8'));
    if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('expected a JSON object');
    // JSON.parse takes nesting that JSON.stringify overflows its stack on: such a body cannot be passed on.
    return { raw, body: parsed as Json, prefillPayload: JSON.stringify(prefillBody(parsed as Json)) };
  } catch (err) {
    sendJson(res, 400, errorJson(400, `Invalid JSON body: ${(err as Error).message}`));
    return null;
  }
}

/** One request's two hops: where they go and what they carry. */
interface Hops {
  path: string;
  prefill: URL;
  decode: URL;
  headers: Record<string, string>;
  /** The client's authorization (or OPENAI_API_KEY's), also for releasing a hold. */
  auth: string | undefined;
  /** Aborted when the client leaves. */
  gone: AbortSignal;
}

/**
 * The prefill hop: the `kv_transfer_params` it answered (undefined: the client has its answer, an error). A client
 * that leaves during it does not cancel it (as vLLM's toy proxy, whose handler runs on): cancelled as the engine
 * answers, the answer naming the blocks it holds for the decode hop would be lost, and those blocks held until the
 * engine's timeout. Read to the end, they are freed by the caller.
 */
async function prefillHop(hops: Hops, payload: string, res: ServerResponse): Promise<{ transfer: unknown } | undefined> {
  let answer: Response;
  let text: string;
  try {
    answer = await fetch(new URL(hops.path, hops.prefill), { method: 'POST', headers: hops.headers, body: payload });
    text = await answer.text();
  } catch (err) {
    if (!hops.gone.aborted) sendJson(res, 502, errorJson(502, `prefill instance ${hops.prefill.origin}: ${(err as Error).message}`, 'BadGateway'));
    return undefined;
  }
  // The toy proxy requires a 2xx; an error from the prefill instance is the client's answer.
  if (!answer.ok) {
    res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' });
    return void res.end(text);
  }
  try {
    return { transfer: (JSON.parse(text) as Json).kv_transfer_params };
  } catch {
    return void sendJson(res, 502, errorJson(502, `prefill instance ${hops.prefill.origin} answered with a body that is not JSON`, 'BadGateway'));
  }
}

/**
 * The decode hop's body: the client's own bytes (what JSON.stringify would change, such as 1e999, big integers or
 * deep nesting, arrives as sent) with the transfer params spliced in as the first member; a body with its own
 * kv_transfer_params is written anew so that the proxy's win.
 */
function decodePayload(client: ClientRequest, transfer: unknown): Buffer {
  const withTransfer = transfer !== null && typeof transfer === 'object' && Object.keys(transfer).length > 0;
  if (!withTransfer) return client.raw;
  return 'kv_transfer_params' in client.body
    ? Buffer.from(JSON.stringify({ ...client.body, kv_transfer_params: transfer }))
    : spliceFirstMember(client.raw, 'kv_transfer_params', JSON.stringify(transfer));
}

/** The decode hop, its bytes piped to the client; whether the decode engine took the request (a 2xx: it then pulls the KV). */
function decodeHop(hops: Hops, payload: Buffer, res: ServerResponse): Promise<boolean> {
  let accepted = false;
  return new Promise<boolean>((resolve) => {
    const target = new URL(hops.path, hops.decode);
    const lib = target.protocol === 'https:' ? https : http;
    const upstream = lib.request(target, {
      method: 'POST',
      headers: { ...hops.headers, 'content-length': payload.length },
      agent: target.protocol === 'https:' ? agents.https : agents.http,
    });
    hops.gone.addEventListener('abort', () => upstream.destroy(), { once: true });
    res.on('close', () => resolve(accepted));
    upstream.on('error', (err) => {
      sendJson(res, 502, errorJson(502, `decode instance ${hops.decode.origin}: ${err.message}`, 'BadGateway'));
      resolve(accepted);
    });
    upstream.on('response', (answer) => {
      accepted = (answer.statusCode ?? 0) < 300;
      const out: http.OutgoingHttpHeaders = {};
      for (const name of ['content-type', 'content-length', 'x-request-id']) if (answer.headers[name] !== undefined) out[name] = answer.headers[name];
      res.writeHead(answer.statusCode ?? 502, out);
      res.flushHeaders();
      answer.pipe(res);
      answer.on('close', () => {
        if (!answer.complete) res.destroy();
      });
    });
    upstream.end(payload);
  });
}

/** Both hops of one generation request, at the next prefill and decode instances. */
async function disaggregate(client: ClientRequest, hops: Hops, res: ServerResponse): Promise<void> {
  const prefilled = await prefillHop(hops, client.prefillPayload, res);
  if (!prefilled) return;
  const { transfer } = prefilled;
  if (hops.gone.aborted) return releaseUnpulled(transfer, hops.prefill, hops.auth);
  let payload: Buffer;
  try {
    payload = decodePayload(client, transfer);
  } catch (err) {
    releaseUnpulled(transfer, hops.prefill, hops.auth);
    return sendJson(res, 400, errorJson(400, `Invalid JSON body: ${(err as Error).message}`));
  }
  if (!(await decodeHop(hops, payload, res))) releaseUnpulled(transfer, hops.prefill, hops.auth);
}

/**
 * `mocker pd-proxy`: vLLM's disaggregated toy proxy (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py).
 * Per request: one X-Request-Id; the prefill instance (round robin) computes the prompt and one token and
 * returns `kv_transfer_params`; the decode instance (round robin) gets the original body plus those params, and
 * its bytes go back to the client untouched.
 */
export async function startPdProxy(options: PdProxyOptions): Promise<RunningProxy> {
  if (options.prefill.length === 0 || options.decode.length === 0) throw new Error('pd-proxy needs at least one --prefill and one --decode URL');
  let nextPrefill = 0;
  let nextDecode = 0;

  const access = options.access ?? { scope: DEFAULT_API_KEY_SCOPE };
  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const method = req.method ?? 'GET';
    const path = decodedPath(req.url ?? '/') ?? '';
    const route = PD_PROXY_ROUTES.find((r) => r.method === method && r.path === path);
    // A path it does not serve is still the API's: under /v1 (or with --api-key-scope all) it needs the key first.
    if (!admitted(access, route?.class ?? 'key', method, path, req.headers.authorization)) return sendJson(res, 401, UNAUTHORIZED_BODY);
    if (!route) return sendJson(res, 404, JSON.stringify({ detail: 'Not Found' }));
    if (route.path === '/healthcheck') {
      return sendJson(res, 200, JSON.stringify({ status: 'ok', prefill_instances: options.prefill.length, decode_instances: options.decode.length }));
    }
    if (route.path === '/health' || route.path === OWN_HEALTH_PATH) return answerHealthy(res);
    const client = await readClientRequest(req, res, options.maxBodyBytes);
    if (!client) return;
    // A client that leaves cancels the decode hop, or has it never sent.
    const gone = abortOnClose(res).signal;
    const auth = req.headers.authorization ?? (process.env.OPENAI_API_KEY ? `Bearer ${process.env.OPENAI_API_KEY}` : undefined);
    const headers = { 'content-type': 'application/json', 'x-request-id': randomUUID(), ...(auth ? { authorization: auth } : {}) };
    const prefill = options.prefill[nextPrefill++ % options.prefill.length];
    const decode = options.decode[nextDecode++ % options.decode.length];
    await disaggregate(client, { path: req.url ?? path, prefill, decode, headers, auth, gone }, res);
  };

  const { drain, server } = options.listening ?? (await listeningServer(options.host, options.port, serverTls(options.tls)));
  drain.handle(server, (req, res) => {
    handle(req, res).catch((err: unknown) => sendJson(res, 500, errorJson(500, `pd-proxy: ${(err as Error).message}`)));
  });
  const port = (server.address() as AddressInfo).port;
  console.log(
    `mocker pd-proxy: ${options.prefill.length} prefill (${options.prefill.map((u) => u.origin).join(', ')}), ${options.decode.length} decode (${options.decode.map((u) => u.origin).join(', ')}) on ${server instanceof https.Server ? 'https' : 'http'}://${options.host}:${port}`,
  );
  return { port, close: (graceMs = 0) => drain.drain(graceMs) };
}
