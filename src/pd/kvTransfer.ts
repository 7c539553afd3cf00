import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { z } from 'zod';
import type { KvTransferParams } from '../api/schemas.js';
import type { PullFailure } from '../metrics/mockerMetrics.js';

/** Where a prefill engine tells decode engines to pull from: itself (mocker's pull is an HTTP call). */
export interface PrefillEndpoint {
  engineId: string;
  host: string;
  port: number;
}

/** The `kv_transfer_params` a prefill engine answers with (NixlConnectorScheduler.request_finished). */
export function prefillResponseParams(endpoint: PrefillEndpoint, holdId: string, blockIds: number[]): Record<string, unknown> {
  return {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: blockIds,
    remote_engine_id: endpoint.engineId,
    remote_request_id: holdId,
    remote_host: endpoint.host,
    remote_port: endpoint.port,
    tp_size: 1,
  };
}

/** The mocker-to-mocker call standing in for the NIXL read: the decode engine asks the prefill engine to hand over (free) its hold. */
export const KV_PULL_PATH = '/mocker/kv_transfer/pull';

export const kvPullRequest = z.strictObject({ remote_engine_id: z.string(), remote_request_id: z.string() });

export type PullOutcome = { ok: true } | { ok: false; reason: PullFailure; detail: string };

/** RFC 1123 host names: dot-separated labels of letters, digits and inner hyphens. */
const HOST_NAME = /^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$/i;

/** `host` as a bare host (a name, an IPv4 address, an IPv6 one without brackets, canonical), lower-cased; null if it is anything else (a path, a port, a URL). */
function bareHost(host: string): string | null {
  const h = host.toLowerCase();
  if (isIP(h) === 6) return new URL(`http://[${h}]`).hostname.slice(1, -1);
  return isIP(h) === 4 || HOST_NAME.test(h) ? h : null;
}

/** A KV transfer peer's key, `host:port` (IPv6 in brackets), as `--kv-transfer-allowed-hosts` lists them; null if not a host and a port. */
export function peerKey(host: string, port: number): string | null {
  const bare = bareHost(host);
  if (bare === null || !Number.isInteger(port) || port < 1 || port > 65535) return null;
  return `${bare.includes(':') ? `[${bare}]` : bare}:${port}`;
}

/** A peer key's host (IPv6 unbracketed) and port. */
function splitPeer(key: string): { host: string; port: number } | null {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(key.trim());
  return m ? { host: m[1] ?? m[2], port: Number(m[3]) } : null;
}

/** One `--kv-transfer-allowed-hosts` entry (`host:port`, `[v6]:port`) as its peer key; throws naming the entry. */
export function parsePeer(text: string): string {
  const peer = splitPeer(text);
  const key = peer ? peerKey(peer.host, peer.port) : null;
  if (key === null) throw new Error(`"${text}" is not host:port (a host name or IP address, IPv6 in brackets, and a port from 1 to 65535)`);
  return key;
}

/**
 * The peer key of `host:port` if `peers` allow it: listed as such, or an IP address that a listed name with the
 * same port resolves to (a Kubernetes headless Service names every prefill pod, each advertising its pod IP).
 */
async function allowedPeer(peers: ReadonlySet<string>, host: string, port: number): Promise<string | null> {
  const key = peerKey(host, port);
  if (key === null || peers.has(key)) return key;
  const address = splitPeer(key)!.host;
  if (isIP(address) === 0) return null;
  for (const peer of peers) {
    const named = splitPeer(peer)!;
    if (named.port !== port || isIP(named.host) !== 0) continue;
    const addresses = await lookup(named.host, { all: true }).catch(() => []);
    if (addresses.some((a) => bareHost(a.address) === address)) return key;
  }
  return null;
}

/** Asks the engine at `origin` to free (hand over) its hold `requestId`: 2xx pulled, 404 not held there. */
export async function requestPull(origin: URL, engineId: string, requestId: string, timeoutMs: number, authorization?: string): Promise<PullOutcome> {
  const where = origin.host;
  let res: Response;
  let text: string;
  try {
    res = await fetch(new URL(KV_PULL_PATH, origin), {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(authorization ? { authorization } : {}) },
      body: JSON.stringify({ remote_engine_id: engineId, remote_request_id: requestId }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    text = await res.text();
  } catch (err) {
    return { ok: false, reason: 'unreachable', detail: `prefill engine ${where}: ${(err as Error).message}` };
  }
  if (res.ok) return { ok: true };
  return {
    ok: false,
    reason: res.status === 404 ? 'unknown_blocks' : 'unreachable',
    detail: `prefill engine ${where} answered ${res.status}: ${text.slice(0, 200)}`,
  };
}

/**
 * Pulls a prefill engine's KV for a decode request: succeeds when that engine still holds the blocks
 * (it frees them as it answers); otherwise the caller recomputes locally (vLLM's `kv_load_failure_policy`
 * "recompute"). Only a peer in `peers` (keys of `peerKey`) is ever called: the params come from a client, and
 * an engine that called wherever they named would be anyone's HTTP client into its network.
 */
export async function pullRemoteKv(params: KvTransferParams, peers: ReadonlySet<string>, timeoutMs: number, authorization?: string): Promise<PullOutcome> {
  const { remote_host: host, remote_port: port, remote_engine_id: engineId, remote_request_id: requestId } = params;
  if (!host || !port || !engineId || !requestId) {
    return { ok: false, reason: 'incomplete_params', detail: 'kv_transfer_params lack remote_host, remote_port, remote_engine_id or remote_request_id' };
  }
  const peer = await allowedPeer(peers, host, port);
  if (peer === null) {
    // Named as sent (escaped, cut short): it is the client's text.
    const named = JSON.stringify(`${host.slice(0, 100)}:${port}`);
    return {
      ok: false,
      reason: 'peer_not_allowed',
      detail: `kv_transfer_params name ${named}, not a prefill engine this one may pull from (--kv-transfer-allowed-hosts)`,
    };
  }
  return requestPull(new URL(`http://${peer}`), engineId, requestId, timeoutMs, authorization);
}

/** Bytes of KV cache per token: layers × 2 (K and V) × KV heads × head dim × dtype bytes (engine-reference §5.2). */
export function kvBytesPerToken(modelConfig: Record<string, unknown>, kvCacheDtype: string): number | null {
  const num = (key: string) => (typeof modelConfig[key] === 'number' ? (modelConfig[key] as number) : undefined);
  const layers = num('num_hidden_layers');
  const heads = num('num_attention_heads');
  const kvHeads = num('num_key_value_heads') ?? heads;
  const hidden = num('hidden_size');
  const headDim = num('head_dim') ?? (hidden !== undefined && heads ? Math.floor(hidden / heads) : undefined);
  if (!layers || !kvHeads || !headDim) return null;
  return layers * 2 * kvHeads * headDim * dtypeBytes(kvCacheDtype, String(modelConfig.torch_dtype ?? modelConfig.dtype ?? ''));
}

/** `--kv-cache-dtype`: auto follows the model's dtype. */
function dtypeBytes(kvCacheDtype: string, modelDtype: string): number {
  if (kvCacheDtype !== 'auto') return kvCacheDtype.startsWith('fp8') ? 1 : kvCacheDtype === 'float32' ? 4 : 2;
  if (modelDtype === 'float32') return 4;
  if (modelDtype.startsWith('float8')) return 1;
  return 2;
}
