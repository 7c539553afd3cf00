/**
 * Closed-loop loads of streamed completions (token-id prompts, exactly `max_tokens` out), measured in a process
 * of their own (`measureLoad`): per request, its TTFT and its gaps between tokens, as the client saw them.
 */
import { execFile } from 'node:child_process';
import http from 'node:http';
import { fileURLToPath } from 'node:url';
import { prng } from './prng.js';

export interface LoadRequest {
  promptTokens: number;
  outputTokens: number;
}

/** `concurrency` clients, each sending the next request of the queue when its last one ends. */
export interface Phase {
  concurrency: number;
  requests: LoadRequest[];
}

export interface Measured {
  ttftMs: number;
  gapsMs: number[];
}

/** One streamed completion: its TTFT and gaps (ms), from when each token's event arrived. */
function streamCompletion(url: string, model: string, agent: http.Agent, request: LoadRequest, ids: number[]): Promise<Measured> {
  const body = JSON.stringify({ model, prompt: ids, max_tokens: request.outputTokens, ignore_eos: true, stream: true });
  return new Promise((resolve, reject) => {
    const sent = performance.now();
    const arrivals: number[] = [];
    const req = http.request(`${url}/v1/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json' } }, (res) => {
      let buffer = '';
      res.on('data', (chunk: Buffer) => {
        const now = performance.now() - sent;
        buffer += chunk.toString('utf8');
        let at: number;
        while ((at = buffer.indexOf('\n\n')) >= 0) {
          const event = buffer.slice(0, at);
          buffer = buffer.slice(at + 2);
          if (event.startsWith('data: {') && (JSON.parse(event.slice(6)) as { choices: unknown[] }).choices.length > 0) arrivals.push(now);
        }
      });
      res.on('end', () => {
        if (res.statusCode !== 200 || arrivals.length !== request.outputTokens)
          return reject(new Error(`status ${res.statusCode}, ${arrivals.length} of ${request.outputTokens} tokens`));
        resolve({ ttftMs: arrivals[0], gapsMs: arrivals.slice(1).map((t, i) => t - arrivals[i]) });
      });
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** Runs the phases in order; prompts are random token ids from `seed` (no two share a cached block). */
async function runLoad(url: string, model: string, phases: Phase[], seed: number): Promise<Measured[]> {
  const random = prng(seed);
  const measured: Measured[] = [];
  for (const { concurrency, requests } of phases) {
    const agent = new http.Agent({ keepAlive: true, maxSockets: concurrency });
    const pending = [...requests];
    await Promise.all(
      Array.from({ length: concurrency }, async () => {
        for (let next = pending.shift(); next; next = pending.shift()) {
          const ids = Array.from({ length: next.promptTokens }, () => random.int(1000, 140_000));
          measured.push(await streamCompletion(url, model, agent, next, ids));
        }
      }),
    );
    agent.destroy();
  }
  return measured;
}

/** Requests of seeded random lengths in [low, high]. */
export function randomRequests(seed: number, count: number, prompt: [number, number], output: [number, number]): LoadRequest[] {
  const random = prng(seed);
  return Array.from({ length: count }, () => ({ promptTokens: random.int(...prompt), outputTokens: random.int(...output) }));
}

/** Runs a load from a fresh process (no garbage or timers of the test runner's in the way). */
export function measureLoad(url: string, model: string, phases: Phase[], seed: number): Promise<Measured[]> {
  const script = fileURLToPath(import.meta.url);
  return new Promise((resolve, reject) => {
    execFile(process.execPath, ['--import', 'tsx', script, url, model, JSON.stringify(phases), String(seed)], { maxBuffer: 64 << 20 }, (err, stdout) =>
      err ? reject(err) : resolve(JSON.parse(stdout) as Measured[]),
    );
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [url, model, phases, seed] = process.argv.slice(2);
  process.stdout.write(JSON.stringify(await runLoad(url, model, JSON.parse(phases) as Phase[], Number(seed))));
}
