import { randomUUID } from 'node:crypto';
import { Hono } from 'hono';
import { detokenizeRequest, parseBody, tokenizeRequest, type ChatRequest } from '../api/schemas.js';
import { badRequest } from '../wire/errors.js';
import type { Prompts } from './prompts.js';
import { readApiJson } from './requestBody.js';
import { on } from './routes.js';
import type { Env, ServeAppConfig } from './serveConfig.js';

/** The models served (base models and LoRA adapters), and vLLM's `/tokenize` and `/detokenize` for them. */
export function modelRoutes(config: ServeAppConfig, prompts: Prompts): Hono<Env> {
  const app = new Hono<Env>();
  on(app, '/tokenize', async (c) => {
    const req = parseBody(tokenizeRequest, (await readApiJson(c)).body);
    prompts.resolveModel(req.model);
    if ((req.prompt === undefined) === (req.messages === undefined)) throw badRequest('Either `prompt` or `messages` must be given.');
    const text = req.messages !== undefined ? await prompts.renderChatPrompt(req as ChatRequest) : req.prompt!;
    const ids = await prompts.encodePrompt(text, req.add_special_tokens ?? req.messages === undefined);
    prompts.checkPromptLength(ids.length, 'tokenize');
    const tokenStrs = req.return_token_strs ? config.tokenizer.tokenStrings(ids) : null;
    return c.json({ count: ids.length, max_model_len: config.maxModelLen, tokens: ids, token_strs: tokenStrs });
  });
  on(app, '/detokenize', async (c) => {
    const req = parseBody(detokenizeRequest, (await readApiJson(c)).body);
    prompts.resolveModel(req.model);
    prompts.checkTokenIds(req.tokens);
    return c.json({ prompt: await config.tokenizer.decode(req.tokens, false) });
  });
  on(app, '/v1/models', (c) => {
    const created = Math.floor(Date.now() / 1000);
    const bases = config.servedModels.map((id) => ({
      id,
      root: config.modelRoot,
      parent: null as string | null,
      max_model_len: config.maxModelLen as number | null,
    }));
    const data = [...bases, ...(config.lora?.cards() ?? [])].map(({ id, root, parent, max_model_len }) => ({
      id,
      object: 'model',
      created,
      owned_by: 'vllm',
      root,
      parent,
      max_model_len,
      permission: [
        {
          id: `modelperm-${randomUUID().replaceAll('-', '')}`,
          object: 'model_permission',
          created,
          allow_create_engine: false,
          allow_sampling: true,
          allow_logprobs: true,
          allow_search_indices: false,
          allow_view: true,
          allow_fine_tuning: false,
          organization: '*',
          group: null,
          is_blocking: false,
        },
      ],
    }));
    return c.body(JSON.stringify({ object: 'list', data }), 200, { 'content-type': 'application/json' });
  });
  return app;
}
