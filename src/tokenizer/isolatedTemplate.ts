import { spawn } from 'node:child_process';

/**
 * Heap of one template's process: a template that builds a giant string runs out of it instead of the server. A
 * process, not a worker thread: a worker that reaches its heap limit can take the whole process down with it.
 */
const RENDER_HEAP_MB = 128;

/** The renderer: reads `{ jinja, source, context }` on stdin, renders with @huggingface/jinja, writes the text. */
const RENDERER_SOURCE = `
let input = '';
process.stdin.setEncoding('utf8').on('data', (d) => (input += d)).on('end', async () => {
  const { jinja, source, context } = JSON.parse(input);
  let out;
  try {
    const { Template } = await import(jinja);
    out = { text: new Template(source).render(context) };
  } catch (err) {
    out = { error: err instanceof Error ? err.message : String(err) };
  }
  process.stdout.end(JSON.stringify(out));
});
`;

const JINJA_URL = import.meta.resolve('@huggingface/jinja');

export class TemplateRenderError extends Error {}

/**
 * Renders `source` with `context` (plain JSON data) in a process of its own, so the event loop never waits on it;
 * the process is killed after `timeoutMs` (a `{% for %}` over millions), or dies alone when it exhausts its heap,
 * and the promise rejects.
 */
export function renderIsolated(source: string, context: Record<string, unknown>, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [`--max-old-space-size=${RENDER_HEAP_MB}`, '-e', RENDERER_SOURCE], { stdio: ['pipe', 'pipe', 'ignore'] });
    const chunks: Buffer[] = [];
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.stdout.on('data', (d: Buffer) => chunks.push(d));
    // A renderer that died early closes its stdin: the write fails, the exit below reports it.
    child.stdin.on('error', () => {});
    child.stdin.end(JSON.stringify({ jinja: JINJA_URL, source, context }));
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(new TemplateRenderError(`the template renderer could not start: ${err.message}`));
    });
    child.once('close', (code, signal) => {
      clearTimeout(timer);
      if (timedOut) return reject(new TemplateRenderError(`rendering was stopped after ${timeoutMs} ms`));
      if (code !== 0) return reject(new TemplateRenderError(`rendering was stopped: its process ended (${signal ?? `exit code ${code}`}), most likely beyond its ${RENDER_HEAP_MB} MB heap`));
      try {
        const out = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { text?: string; error?: string };
        if (out.error !== undefined) reject(new TemplateRenderError(out.error));
        else resolve(out.text ?? '');
      } catch {
        reject(new TemplateRenderError('the template renderer answered nothing readable'));
      }
    });
  });
}
