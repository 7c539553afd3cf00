import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { setPriority } from 'node:os';

/**
 * Heap of a renderer process: a template that builds a giant string runs out of it instead of the server. A
 * process, not a worker thread: a worker that reaches its heap limit can take the whole process down with it.
 * With 1 MB semi-spaces a renderer dying at this limit peaks near 150 MB of RSS (at 128 MB and the default
 * semi-spaces: near 200 MB, and two renderers with the server passed 1 GB in bench:hostile).
 */
const RENDER_HEAP_MB = 96;

/**
 * Renderer processes kept running. Spawning one per render cost 113 ms a render (measured: a Node start and the
 * import of @huggingface/jinja), and 16 at once on 2 cores passed the 2 s limit; a kept process answers in well
 * under a millisecond. Two: a hostile template holds one until it is stopped, the other keeps serving.
 */
const RENDERERS = 2;

/**
 * Longest rendered chat a renderer sends back, in characters: far past any context (a million tokens are 3 to 5
 * million characters), and what the server holds of one render at most.
 */
const RENDER_MAX_CHARS = 16 * 1024 * 1024;

/**
 * The renderer: a first line `ready` once it has loaded, then one request a line on stdin (`{ source, context }`),
 * one answer a line on stdout (`{ text }` or `{ error }`); compiled templates are kept by source (a few: a
 * capture's, a request's). It ends with its stdin, so it never outlives the server.
 */
const RENDERER_SOURCE = `
const { Template } = await import(process.argv[1]);
const maxChars = Number(process.argv[2]);
const compiled = new Map();
const render = (line) => {
  try {
    const { source, context } = JSON.parse(line);
    let template = compiled.get(source);
    if (!template) {
      if (compiled.size >= 16) compiled.clear();
      template = new Template(source);
      compiled.set(source, template);
    }
    const text = template.render(context);
    if (text.length > maxChars) return JSON.stringify({ error: \`the rendered chat is longer than \${maxChars} characters\` });
    return JSON.stringify({ text });
  } catch (err) {
    return JSON.stringify({ error: err instanceof Error ? err.message : String(err) });
  }
};
let pending = [];
process.stdin.setEncoding('utf8');
process.stdin.on('data', (data) => {
  let from = 0;
  for (let nl = data.indexOf('\\n'); nl >= 0; nl = data.indexOf('\\n', from)) {
    pending.push(data.slice(from, nl));
    const line = pending.join('');
    pending = [];
    process.stdout.write(render(line) + '\\n');
    from = nl + 1;
  }
  if (from < data.length) pending.push(data.slice(from));
});
process.stdin.on('end', () => process.exit(0));
process.stdout.write('ready\\n');
`;

const JINJA_URL = import.meta.resolve('@huggingface/jinja');

/**
 * A render's limit is CPU time, not wall time: a renderer at nice 19 on a busy machine may get a few percent of a
 * core, and a legitimate chat must not fail for that. The wall clock still ends a render after this many times
 * its limit (a renderer that cannot be measured: after its limit).
 */
const WALL_LIMIT_FACTOR = 10;

/** CPU time (ms) process `pid` has used, from /proc (Linux; its clock ticks are 1/100 s); null when unreadable. */
function cpuMs(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // After the command name (which may hold spaces): state, then utime and stime are the 12th and 13th fields.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? ticks * 10 : null;
  } catch {
    return null;
  }
}

export class TemplateRenderError extends Error {}

interface Job {
  line: string;
  timeoutMs: number;
  resolve(text: string): void;
  reject(err: TemplateRenderError): void;
}

/** One renderer process and the render it is busy with. */
class Renderer {
  readonly child: ChildProcess;
  /** Loaded and listening: renders are handed to it only then, so its start never counts against a render's time. */
  ready = false;
  job: Job | null = null;
  private timer: NodeJS.Timeout | null = null;
  private timedOut = false;
  private readonly answer: string[] = [];

  constructor(
    private readonly onGone: (renderer: Renderer, why: string) => void,
    private readonly onIdle: () => void,
  ) {
    this.child = spawn(
      process.execPath,
      [`--max-old-space-size=${RENDER_HEAP_MB}`, '--max-semi-space-size=1', '--input-type=module', '-e', RENDERER_SOURCE, JINJA_URL, String(RENDER_MAX_CHARS)],
      { stdio: ['pipe', 'pipe', 'ignore'] },
    );
    // Idle renderers keep no one waiting: the server exits when it is done (and they with their stdin).
    this.child.unref();
    for (const stream of [this.child.stdin, this.child.stdout] as unknown as { unref?: () => void }[]) stream.unref?.();
    this.child.stdout!.setEncoding('utf8');
    this.child.stdout!.on('data', (data: string) => this.read(data));
    // A renderer that died closes its stdin: the write fails, the exit below reports it.
    this.child.stdin!.on('error', () => {});
    this.child.once('error', (err) => this.end(`the template renderer could not start: ${err.message}`));
    this.child.once('exit', (code, signal) =>
      this.end(
        !this.ready
          ? `the template renderer could not start (${signal ?? `exit code ${code}`})`
          : this.timedOut
            ? `rendering was stopped after ${this.job?.timeoutMs} ms`
            : `rendering was stopped: its process ended (${signal ?? `exit code ${code}`}), most likely beyond its ${RENDER_HEAP_MB} MB heap`,
      ),
    );
  }

  run(job: Job): void {
    this.job = job;
    this.timedOut = false;
    const startedMs = performance.now();
    const startCpuMs = cpuMs(this.child.pid);
    // Checked when the render could have used its limit of CPU; a render in flight keeps the server's loop alive
    // (the timer is ref'd), an idle renderer does not.
    const check = () => {
      const now = cpuMs(this.child.pid);
      const used = startCpuMs === null || now === null ? null : now - startCpuMs;
      if (used === null || used >= job.timeoutMs || performance.now() - startedMs >= job.timeoutMs * WALL_LIMIT_FACTOR) {
        this.timedOut = true;
        this.child.kill('SIGKILL');
      } else this.timer = setTimeout(check, Math.max(job.timeoutMs - used, 50));
    };
    this.timer = setTimeout(check, job.timeoutMs);
    this.child.stdin!.write(job.line);
  }

  private read(data: string): void {
    let from = 0;
    for (let nl = data.indexOf('\n'); nl >= 0; nl = data.indexOf('\n', from)) {
      this.answer.push(data.slice(from, nl));
      from = nl + 1;
      const line = this.answer.join('');
      this.answer.length = 0;
      if (this.ready) this.answered(line);
      else this.loaded();
    }
    if (from < data.length) this.answer.push(data.slice(from));
  }

  private answered(line: string): void {
    const job = this.job;
    this.settle();
    if (job) {
      try {
        const out = JSON.parse(line) as { text?: string; error?: string };
        if (out.error !== undefined) job.reject(new TemplateRenderError(out.error));
        else job.resolve(out.text ?? '');
      } catch {
        job.reject(new TemplateRenderError('the template renderer answered nothing readable'));
      }
    }
    this.onIdle();
  }

  /**
   * Its start ran at the server's priority (at nice 19 on a busy machine, a Node start could take seconds); from
   * now on at nice 19: a template spinning until its stop takes what CPU the server leaves, not the server's own
   * share (four spinning renderers on 2 cores put /health's p99 over 100 ms; bench/hostile.ts).
   */
  private loaded(): void {
    this.ready = true;
    try {
      if (this.child.pid !== undefined) setPriority(this.child.pid, 19);
    } catch {
      // Not allowed here: the renderer keeps the server's priority.
    }
    this.onIdle();
  }

  private settle(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.job = null;
  }

  /** The process is gone (stopped, out of heap, never started): its render fails, the pool replaces it. */
  private end(why: string): void {
    const job = this.job;
    this.settle();
    this.onGone(this, why);
    job?.reject(new TemplateRenderError(why));
  }
}

/** Renderer processes started on first use and replaced when one is stopped or dies; renders wait their turn. */
class RendererPool {
  private readonly renderers = new Set<Renderer>();
  private readonly queue: Job[] = [];

  render(job: Job): void {
    this.queue.push(job);
    this.dispatch();
  }

  private dispatch(): void {
    while (this.queue.length > 0) {
      const idle = [...this.renderers].find((r) => r.ready && r.job === null);
      if (idle) {
        idle.run(this.queue.shift()!);
        continue;
      }
      // Renders wait for one that is loaded or becomes free; as many start as there are renders waiting.
      const starting = [...this.renderers].filter((r) => !r.ready).length;
      for (let n = starting; n < this.queue.length && this.renderers.size < RENDERERS; n++)
        this.renderers.add(
          new Renderer(
            (gone, why) => this.gone(gone, why),
            () => this.dispatch(),
          ),
        );
      return;
    }
  }

  private gone(renderer: Renderer, why: string): void {
    this.renderers.delete(renderer);
    // One that could not even start would not start again: the renders waiting fail instead of respawning it for ever.
    if (!renderer.ready) for (const job of this.queue.splice(0)) job.reject(new TemplateRenderError(why));
    this.dispatch();
  }
}

const pool = new RendererPool();

/**
 * Renders `source` with the variables of `contextJson` (a JSON object) in a renderer process, so the event loop never waits on it;
 * a render is stopped (its process killed, and replaced) after `timeoutMs` (a `{% for %}` over millions), or dies
 * alone when it exhausts the process's heap, and the promise rejects. The time counts from the render's start,
 * not from its wait for a free renderer.
 */
export function renderIsolated(source: string, contextJson: string, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => pool.render({ line: `{"source":${JSON.stringify(source)},"context":${contextJson}}\n`, timeoutMs, resolve, reject }));
}
