import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startFastUpstream, MODEL } from '../bench/lib/fastUpstream.js';
import { startCapture } from '../src/cli/capture.js';
import { postStream } from '../bench/lib/sseClient.js';

const dir = mkdtempSync(join(tmpdir(), 'inproc-'));
const up = await startFastUpstream({ gapMs: 5, tokens: 256 } as never);
const cap = await startCapture({ upstream: `http://127.0.0.1:${up.port}`, captures: join(dir, 'c.db'), host: '127.0.0.1', port: 0, upstreamTimeoutMs: 10000, maxBodyBytes: 1 << 20, redactHeaders: [] } as never);
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
const BODY = JSON.stringify({ model: MODEL, prompt: 'Summarize the following text in one paragraph. '.repeat(85), max_tokens: 256, stream: true });
const stopAt = Date.now() + Number(process.env.SECS ?? 6) * 1000;
let n = 0;
await Promise.all(Array.from({ length: 64 }, async () => {
  while (Date.now() < stopAt) { await postStream(agent, `http://127.0.0.1:${cap.port}/v1/completions`, BODY, {}); n++; }
}));
console.log('requests', n);
agent.destroy();
await cap.close();
await up.close();
rmSync(dir, { recursive: true, force: true });
