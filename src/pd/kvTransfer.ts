import { z } from 'zod';

/**
 * vLLM's NIXL-connector `kv_transfer_params` (vllm-wire-reference.md §7). Unknown keys pass through
 * untouched (other connectors add their own).
 */
export const kvTransferParams = z.looseObject({
  do_remote_decode: z.boolean().nullish(),
  do_remote_prefill: z.boolean().nullish(),
  remote_engine_id: z.string().nullish(),
  remote_request_id: z.string().nullish(),
  remote_block_ids: z.array(z.number()).nullish(),
  remote_host: z.string().nullish(),
  remote_port: z.number().int().nullish(),
  tp_size: z.number().int().nullish(),
});
export type KvTransferParams = z.infer<typeof kvTransferParams>;

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

export type PullOutcome = { ok: true } | { ok: false; reason: 'incomplete_params' | 'unknown_blocks' | 'unreachable'; detail: string };

/**
 * Pulls a prefill engine's KV for a decode request: succeeds when that engine still holds the blocks
 * (it frees them as it answers); otherwise the caller recomputes locally (vLLM's `kv_load_failure_policy`
 * "recompute").
 */
export async function pullRemoteKv(params: KvTransferParams, timeoutMs: number): Promise<PullOutcome> {
  const { remote_host: host, remote_port: port, remote_engine_id: engineId, remote_request_id: requestId } = params;
  if (!host || !port || !engineId || !requestId) {
    return { ok: false, reason: 'incomplete_params', detail: 'kv_transfer_params lack remote_host, remote_port, remote_engine_id or remote_request_id' };
  }
  const where = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  let res: Response;
  let text: string;
  try {
    res = await fetch(`http://${where}${KV_PULL_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ remote_engine_id: engineId, remote_request_id: requestId }),
      signal: AbortSignal.timeout(timeoutMs),
    });
    text = await res.text();
  } catch (err) {
    return { ok: false, reason: 'unreachable', detail: `prefill engine ${where}: ${(err as Error).message}` };
  }
  if (res.ok) return { ok: true };
  return { ok: false, reason: res.status === 404 ? 'unknown_blocks' : 'unreachable', detail: `prefill engine ${where} answered ${res.status}: ${text.slice(0, 200)}` };
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
