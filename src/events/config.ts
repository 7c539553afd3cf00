import { z } from 'zod';
import type { KvEventsFormat } from './encoding.js';

/** Where and how one engine publishes KV events (before the per-rank port offset). */
export interface KvEventsConfig {
  endpoint: string;
  replayEndpoint: string | null;
  topic: string;
  bufferSteps: number;
  hwm: number;
  format: KvEventsFormat;
}

/** vLLM's KVEventsConfig (vllm/config/kv_events.py), with its defaults. */
const kvEventsConfigJson = z.strictObject({
  enable_kv_cache_events: z.boolean().default(false),
  publisher: z.enum(['zmq', 'null']).nullable().optional(),
  endpoint: z.string().min(1).default('tcp://*:5557'),
  replay_endpoint: z.string().min(1).nullable().default(null),
  buffer_steps: z.number().int().min(0).default(10_000),
  hwm: z.number().int().min(0).default(100_000),
  max_queue_size: z.number().int().min(1).default(100_000),
  topic: z.string().default(''),
});

/** `--kv-events-config` JSON; null when events are off (not enabled, or publisher "null"). */
export function parseKvEventsConfig(json: string, format: KvEventsFormat): KvEventsConfig | null {
  let raw: unknown;
  try {
    raw = JSON.parse(json);
  } catch (err) {
    throw new Error(`--kv-events-config: not valid JSON (${(err as Error).message})`);
  }
  const parsed = kvEventsConfigJson.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`--kv-events-config: ${issue.path.length ? `"${issue.path.join('.')}": ` : ''}${issue.message}`);
  }
  const c = parsed.data;
  // vLLM: publisher None becomes "zmq" when events are enabled.
  if (!c.enable_kv_cache_events || c.publisher === 'null') return null;
  return { endpoint: c.endpoint, replayEndpoint: c.replay_endpoint, topic: c.topic, bufferSteps: c.buffer_steps, hwm: c.hwm, format };
}

/** Dynamo's `--zmq-kv-events-ports` / `--zmq-replay-ports`: one port per worker, bound on every interface, topic "". */
export function dynamoKvEventsConfigs(
  eventPorts: readonly number[],
  replayPorts: readonly number[] | undefined,
  workers: number,
  format: KvEventsFormat,
): KvEventsConfig[] {
  if (eventPorts.length !== workers) throw new Error(`--zmq-kv-events-ports: ${eventPorts.length} port(s) for ${workers} worker(s); give one per worker`);
  if (replayPorts && replayPorts.length !== workers)
    throw new Error(`--zmq-replay-ports: ${replayPorts.length} port(s) for ${workers} worker(s); give one per worker`);
  return eventPorts.map((port, w) => ({
    endpoint: `tcp://*:${port}`,
    replayEndpoint: replayPorts ? `tcp://*:${replayPorts[w]}` : null,
    topic: '',
    bufferSteps: 10_000,
    hwm: 100_000,
    format,
  }));
}

/** vLLM offset_endpoint_port: rank r publishes on port + r (inproc: a `_dp{r}` suffix). */
export function offsetEndpoint(endpoint: string, offset: number): string {
  if (offset === 0) return endpoint;
  if (endpoint.includes('inproc')) return `${endpoint}_dp${offset}`;
  const match = /^(tcp:\/\/.*):(\d+)$/.exec(endpoint);
  if (!match) throw new Error(`KV events endpoint ${endpoint}: several ranks need a tcp://host:port or inproc:// endpoint to offset`);
  return `${match[1]}:${Number(match[2]) + offset}`;
}
