/** The vLLM release whose wire formats mocker reproduces when it has no captured engine to imitate. */
export const EMULATED_VLLM_VERSION = '0.11.0';

export interface EngineIdentity {
  versionJson?: string;
  engineVersion?: string;
  modelsJson?: string;
  maxModelLen?: number;
  /** The first served model's `root` (its path or HF id), to find its tokenizer locally. */
  modelRoot?: string;
}

async function getText(url: URL): Promise<string | undefined> {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
    return res.ok ? await res.text() : undefined;
  } catch {
    return undefined;
  }
}

/** The upstream's `/version` and `/v1/models`, recorded once per capture run (best effort). */
export async function engineIdentity(upstream: URL): Promise<EngineIdentity> {
  const base = upstream.pathname.replace(/\/$/, '');
  const versionJson = await getText(new URL(`${base}/version`, upstream));
  const modelsJson = await getText(new URL(`${base}/v1/models`, upstream));
  const identity: EngineIdentity = { versionJson, modelsJson };
  try {
    if (versionJson) identity.engineVersion = String((JSON.parse(versionJson) as { version?: unknown }).version ?? '');
  } catch {
    // Not JSON: kept verbatim in versionJson.
  }
  try {
    const first = modelsJson ? (JSON.parse(modelsJson) as { data?: { id?: string; root?: string; max_model_len?: number }[] }).data?.[0] : undefined;
    if (first?.max_model_len) identity.maxModelLen = first.max_model_len;
    identity.modelRoot = first?.root ?? first?.id;
  } catch {
    // Not JSON: kept verbatim in modelsJson.
  }
  return identity;
}
