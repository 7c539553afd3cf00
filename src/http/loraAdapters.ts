import { z } from 'zod';
import { log } from '../util/log.js';
import type { LoraAdapter } from '../engine/index.js';
import { ApiError } from '../wire/errors.js';

/** vLLM's LoRAModulePath: one `--lora-modules` entry. */
export interface LoraModule {
  name: string;
  path: string;
  base_model_name?: string | null;
}

const loraModuleJson = z.strictObject({ name: z.string(), path: z.string(), base_model_name: z.string().nullish() });

/**
 * One `--lora-modules` value, read as vLLM's LoRAParserAction reads it: `name=path`, or the JSON form
 * `{"name","path","base_model_name"}`; besides, a bare `name` (an adapter a mock needs no weights for: its path
 * is its name, as a Hugging Face id would be). Throws with vLLM's messages.
 */
export function parseLoraModule(item: string): LoraModule {
  if (item.includes('=') && !item.includes(',')) {
    const parts = item.split('=');
    if (parts.length !== 2 || !parts[0] || !parts[1]) throw new Error(`Invalid --lora-modules entry: ${item} (expected name=path)`);
    return { name: parts[0], path: parts[1] };
  }
  if (/^[^\s{["]+$/.test(item)) return { name: item, path: item };
  let json: unknown;
  try {
    json = JSON.parse(item);
  } catch {
    throw new Error(`Invalid JSON format for --lora-modules: ${item}`);
  }
  const parsed = loraModuleJson.safeParse(json);
  if (!parsed.success)
    throw new Error(
      `Invalid fields for --lora-modules: ${item} - ${parsed.error.issues.map((i) => `${i.path.join('.') || 'value'}: ${i.message}`).join('; ')}`,
    );
  return parsed.data;
}

/** vLLM's LoadLoRAAdapterRequest and UnloadLoRAAdapterRequest. */
export const loadLoraRequest = z.looseObject({ lora_name: z.string(), lora_path: z.string(), load_inplace: z.boolean().optional() });
export const unloadLoraRequest = z.looseObject({ lora_name: z.string(), lora_int_id: z.number().int().nullish() });

interface LoadedAdapter {
  adapter: LoraAdapter;
  path: string;
  parent: string;
}

/**
 * The adapters a server offers (vLLM's OpenAIServingModels LoRA half): loaded at start from `--lora-modules` or
 * at run time, with vLLM's answers and errors. A mock needs no weights: a path is recorded, never read, so a path
 * that does not exist loads (vLLM would answer 404 "No adapter found").
 */
export class LoraAdapters {
  private readonly loaded = new Map<string, LoadedAdapter>();
  /** vLLM's lora_id_counter: every new adapter takes the next id, never reused. */
  private lastId = 0;

  constructor(
    /** --enable-lora: without it every load fails, as on vLLM. */
    readonly enabled: boolean,
    /** The served model names: the adapters' default parent, and names an adapter may not take. */
    private readonly baseModels: readonly string[],
    modules: readonly LoraModule[] = [],
  ) {
    for (const m of modules) {
      try {
        this.load(m.name, m.path, m.base_model_name ?? undefined);
      } catch (err) {
        throw new Error(`--lora-modules: ${(err as Error).message}`);
      }
    }
  }

  /** vLLM's load_lora_adapter: the success text, or an ApiError (400, 404) in vLLM's shape. */
  load(name: string, path: string, baseModelName?: string, loadInplace = false): string {
    if (!name || !path) throw new ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", 'InvalidUserInput');
    const existing = this.loaded.get(name);
    if (existing && !loadInplace) {
      throw new ApiError(
        400,
        `The lora adapter '${name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.`,
        'InvalidUserInput',
      );
    }
    if (!this.enabled) throw new ApiError(400, 'LoRA is not enabled. Use --enable-lora to enable LoRA.', 'BadRequestError');
    // Mocker's own check: a name the base model answers to would never reach the adapter.
    if (this.baseModels.includes(name)) throw new ApiError(400, `The lora adapter name '${name}' conflicts with a served base model.`, 'InvalidUserInput');
    // vLLM keeps base_model_name only when it names a served model; the card's parent falls back to the first.
    const parent = baseModelName !== undefined && this.baseModels.includes(baseModelName) ? baseModelName : this.baseModels[0];
    this.loaded.set(name, { adapter: { name, id: existing?.adapter.id ?? ++this.lastId }, path, parent });
    log('info', `mocker serve: Loaded new LoRA adapter: name '${name}', path '${path}'`);
    return `Success: LoRA adapter '${name}' added successfully.`;
  }

  /** vLLM's unload_lora_adapter. Requests already running under the adapter finish under it. */
  unload(name: string): string {
    if (!name) throw new ApiError(400, "'lora_name' needs to be provided to unload a LoRA adapter.", 'InvalidUserInput');
    if (!this.loaded.delete(name)) throw new ApiError(404, `The lora adapter '${name}' cannot be found.`, 'NotFoundError');
    log('info', `mocker serve: Removed LoRA adapter: name '${name}'`);
    return `Success: LoRA adapter '${name}' removed successfully.`;
  }

  /** The adapter a request's `model` names, if any. */
  resolve(model: string): LoraAdapter | undefined {
    return this.loaded.get(model)?.adapter;
  }

  /** `/v1/models` cards past the base models': vLLM's LoRA ModelCard fields (`permission` is added by the caller). */
  cards(): { id: string; root: string; parent: string; max_model_len: null }[] {
    return [...this.loaded.values()].map((a) => ({ id: a.adapter.name, root: a.path, parent: a.parent, max_model_len: null }));
  }
}

/** vLLM attaches the load and unload routes only when VLLM_ALLOW_RUNTIME_LORA_UPDATING is true. */
export function runtimeLoraUpdating(env: NodeJS.ProcessEnv = process.env): boolean {
  // vLLM's envs: `os.environ.get(...,"0").strip().lower() in ("1", "true")`.
  return ['1', 'true'].includes((env.VLLM_ALLOW_RUNTIME_LORA_UPDATING ?? '0').trim().toLowerCase());
}
