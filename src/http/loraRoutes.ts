import { RESPONSE_ALREADY_SENT } from '@hono/node-server/utils/response';
import { Hono, type Context } from 'hono';
import { parseBody } from '../api/schemas.js';
import { loadLoraRequest, unloadLoraRequest, type LoraAdapters } from './loraAdapters.js';
import { readApiJson } from './requestBody.js';
import { on } from './routes.js';
import type { Env } from './serveConfig.js';

/** vLLM's runtime LoRA loading and unloading (VLLM_ALLOW_RUNTIME_LORA_UPDATING). */
export function loraRoutes(adapters: LoraAdapters): Hono<Env> {
  const app = new Hono<Env>();
  // vLLM answers success as bare text: a Starlette Response with no content type.
  const untyped = (c: Context<Env>, text: string) => {
    c.env.outgoing.writeHead(200, { 'content-length': Buffer.byteLength(text) }).end(text);
    return RESPONSE_ALREADY_SENT;
  };
  on(app, '/v1/load_lora_adapter', async (c) => {
    const req = parseBody(loadLoraRequest, (await readApiJson(c)).body);
    return untyped(c, adapters.load(req.lora_name, req.lora_path, undefined, req.load_inplace));
  });
  on(app, '/v1/unload_lora_adapter', async (c) => untyped(c, adapters.unload(parseBody(unloadLoraRequest, (await readApiJson(c)).body).lora_name)));
  return app;
}
