/**
 * Capture files through the spawned CLI: replay from read-only storage (a 0444 file in a 0555 directory, run so
 * that the permissions bind it: as root, without the capabilities that override them), a missing file named and
 * never created, and a taken port
 * that fails before anything is written.
 */
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { join } from 'node:path';
import OpenAI from 'openai';
import { afterAll, describe, expect, it } from 'vitest';
import { permissionsBinding, runMockerToExit, startMockerProcess, type MockerProcess } from '../support/mockerProcess.js';
import { MODEL, startUpstream, type Upstream } from '../support/vllmUpstream.js';
import { testTmpdir } from '../support/tempRoot.js';

const processes: MockerProcess[] = [];
const upstreams: Upstream[] = [];
/** Directories made read-only: writable again at the end, so the suite's teardown can remove them. */
const readOnlyDirs: string[] = [];
afterAll(async () => {
  for (const p of processes) if (p.child.exitCode === null && p.child.signalCode === null) p.child.kill('SIGKILL');
  await Promise.all(upstreams.map((u) => u.close()));
  for (const dir of readOnlyDirs) chmodSync(dir, 0o755);
});

const tempDir = () => mkdtempSync(join(testTmpdir(), 'mocker-readonly-'));
const answerTo = (prompt: unknown) => `Answer to ${String(prompt)}.`;
const prompts = ['first question', 'second question', 'third question'];
const client = (port: number) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused', maxRetries: 0 });
const sha256 = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');

/** Records `prompts` with a spawned capture in front of the engine double, stopped cleanly. */
async function recordGolden(db: string): Promise<void> {
  const up = await startUpstream((body) => ({ content: answerTo(body.prompt) }));
  upstreams.push(up);
  const capture = await startMockerProcess(['capture', '--upstream', up.url, '--captures', db]);
  processes.push(capture);
  for (const prompt of prompts) await client(capture.port).completions.create({ model: MODEL, prompt });
  await capture.stop();
}

describe('replay from read-only storage', () => {
  it('serves from a chmod 0444 file in a chmod 0555 directory, and writes nothing there', async () => {
    const golden = join(tempDir(), 'golden.db');
    await recordGolden(golden);

    const dir = tempDir();
    const db = join(dir, 'golden.db');
    copyFileSync(golden, db);
    chmodSync(db, 0o444);
    chmodSync(dir, 0o555);
    readOnlyDirs.push(dir);
    const digest = sha256(db);

    // The proof holds: a process run the same way cannot create a file in the directory, nor open the file for writing.
    const tryWrite = (code: string) => spawnSync(...permissionsBinding([process.execPath, '-e', code]), { encoding: 'utf8' });
    expect(tryWrite(`require('fs').writeFileSync(${JSON.stringify(join(dir, 'probe'))}, 'x')`).stderr).toContain('EACCES');
    expect(tryWrite(`require('fs').openSync(${JSON.stringify(db)}, 'r+')`).stderr).toContain('EACCES');

    const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', db, '--timing', 'none'], 0, { cwd: dir, bound: true });
    processes.push(replay);
    // What the file holds, said at start: one capture run of a vLLM engine, its model, three complete exchanges.
    expect(replay.stdout()).toContain(`${db} holds 1 run(s) (engines: vllm), models: ${MODEL}, 3 complete exchange(s)`);
    for (const prompt of prompts) expect((await client(replay.port).completions.create({ model: MODEL, prompt })).choices[0].text).toBe(answerTo(prompt));
    await replay.stop();
    expect(replay.stderr()).toBe('');
    expect(readdirSync(dir)).toEqual(['golden.db']);
    expect(sha256(db)).toBe(digest);
  });

  it('a capture file left in WAL mode (its writer was killed) is an error naming it, from a read-only directory', async () => {
    const up = await startUpstream((body) => ({ content: answerTo(body.prompt) }));
    upstreams.push(up);
    const live = join(tempDir(), 'live.db');
    const capture = await startMockerProcess(['capture', '--upstream', up.url, '--captures', live]);
    processes.push(capture);
    await client(capture.port).completions.create({ model: MODEL, prompt: prompts[0] });
    capture.child.kill('SIGKILL');
    await capture.exited;

    const dir = tempDir();
    const db = join(dir, 'live.db');
    // What a killed writer leaves: the database and its write-ahead log.
    copyFileSync(live, db);
    copyFileSync(`${live}-wal`, `${db}-wal`);
    chmodSync(db, 0o444);
    chmodSync(`${db}-wal`, 0o444);
    chmodSync(dir, 0o555);
    readOnlyDirs.push(dir);
    const result = await runMockerToExit(['serve', '--mode', 'replay', '--captures', db, '--host', '127.0.0.1', '--port', '0'], { cwd: dir, bound: true });
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`capture file ${db}`);
    expect(result.stderr).toContain('WAL mode');
    expect(readdirSync(dir).sort()).toEqual(['live.db', 'live.db-wal']);
  });

  it('a replay server busy with lookups does not keep a capture out of its file, and then replays what it recorded', async () => {
    const db = join(tempDir(), 'shared.db');
    await recordGolden(db);
    const replay = await startMockerProcess(['serve', '--mode', 'replay', '--captures', db, '--timing', 'none']);
    processes.push(replay);
    // Lookups of other prompts all along (misses: 404): the server's reads keep taking the file's shared lock.
    let reading = true;
    const statuses: number[] = [];
    const lookups = (async () => {
      for (let k = 0; reading; k++) {
        const res = await fetch(`http://127.0.0.1:${replay.port}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: MODEL, prompt: `busy ${k}` }),
        });
        await res.arrayBuffer();
        statuses.push(res.status);
      }
    })();
    // Raced with the lookups: a failed one ends the wait with its error.
    while (statuses.length < 20) await Promise.race([lookups, new Promise((resolve) => setTimeout(resolve, 5))]);

    // A second capture into the same file: it takes the file for writing (WAL mode) and records one more prompt.
    const up = await startUpstream((body) => ({ content: answerTo(body.prompt) }));
    upstreams.push(up);
    const answeredBefore = statuses.length;
    const capture = await startMockerProcess(['capture', '--upstream', up.url, '--captures', db]);
    processes.push(capture);
    await client(capture.port).completions.create({ model: MODEL, prompt: 'fourth question' });
    await capture.stop();
    expect(capture.stdout()).toContain('1 exchange(s) recorded');
    // The server went on answering meanwhile, every lookup a plain miss (none failed on the lock).
    expect(statuses.length).toBeGreaterThan(answeredBefore);
    reading = false;
    await lookups;
    expect(new Set(statuses)).toEqual(new Set([404]));

    expect((await client(replay.port).completions.create({ model: MODEL, prompt: 'fourth question' })).choices[0].text).toBe(answerTo('fourth question'));
    await replay.stop();
    expect(replay.stderr()).toBe('');
  });

  it('a capture file that is not there is an error naming it; nothing is created', async () => {
    const dir = tempDir();
    const missing = join(dir, 'no', 'such', 'file.db');
    const result = await runMockerToExit(['serve', '--mode', 'replay', '--captures', missing, '--host', '127.0.0.1', '--port', '0']);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(missing);
    expect(readdirSync(dir)).toEqual([]);
  });
});

describe('a port that is taken', () => {
  let blocker: Server;
  let port: number;
  afterAll(() => new Promise<void>((resolve) => blocker.close(() => resolve())));

  it.each([
    ['capture', (db: string, upstream: string) => ['capture', '--upstream', upstream, '--captures', db]],
    ['serve --on-miss record', (db: string, upstream: string) => ['serve', '--on-miss', 'record', '--upstream', upstream, '--captures', db]],
  ])('%s exits 1 naming the port, and leaves no capture file', async (_, args) => {
    if (!blocker) {
      blocker = createServer();
      await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', resolve));
      port = (blocker.address() as { port: number }).port;
    }
    const up = await startUpstream((body) => ({ content: answerTo(body.prompt) }));
    upstreams.push(up);
    const dir = tempDir();
    const result = await runMockerToExit([...args(join(dir, 'captures', 'taken.db'), up.url), '--host', '127.0.0.1', '--port', String(port)]);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(`port ${port}`);
    expect(readdirSync(dir)).toEqual([]);
  });
});
