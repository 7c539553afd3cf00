/**
 * Summarizes a V8 .cpuprofile (node --cpu-prof): self time per function and per source file.
 *   npx tsx bench/lib/cpuProfile.ts FILE.cpuprofile|DIR [top]
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { printTable } from './stats.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

export interface ProfileSummary {
  totalMs: number;
  idleMs: number;
  functions: { name: string; where: string; selfMs: number; pct: number }[];
  files: { file: string; selfMs: number; pct: number }[];
  /** Functions of the project (src/) by inclusive time: themselves plus everything they called. */
  project: { name: string; where: string; totalMs: number; pct: number }[];
}

function shortUrl(url: string): string {
  if (!url) return '(native)';
  const at = url.search(/\/(src|bench|test|node_modules)\//);
  return at >= 0 ? url.slice(at + 1) : url.replace(/^file:\/\//, '');
}

export function summarizeProfile(profile: Profile, top = 15): ProfileSummary {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const self = new Map<number, number>();
  profile.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const fn = new Map<string, { name: string; where: string; us: number }>();
  const file = new Map<string, number>();
  let totalUs = 0;
  let idleUs = 0;
  for (const [id, us] of self) {
    const { functionName, url, lineNumber } = byId.get(id)!.callFrame; // every sampled id is a node of the profile
    totalUs += us;
    if (functionName === '(idle)') idleUs += us;
    // tsx-transpiled files come out as one line: their positions are not the source's, the file is enough.
    const where = url ? (lineNumber > 0 ? `${shortUrl(url)}:${lineNumber + 1}` : shortUrl(url)) : '';
    const key = `${functionName}@${where}`;
    const entry = fn.get(key) ?? { name: functionName || '(anonymous)', where, us: 0 };
    entry.us += us;
    fn.set(key, entry);
    const f = url ? shortUrl(url).replace(/^(node_modules\/(@[^/]+\/)?[^/]+)\/.*$/, '$1') : functionName.startsWith('(') ? functionName : '(native)';
    file.set(f, (file.get(f) ?? 0) + us);
  }
  // Inclusive time of project functions: each sample counts once for every src/ function on its stack.
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const inclusive = new Map<string, { name: string; where: string; us: number }>();
  profile.samples.forEach((id, i) => {
    const seen = new Set<string>();
    for (let n: number | undefined = id; n !== undefined; n = parent.get(n)) {
      const { functionName, url } = byId.get(n)!.callFrame; // parents are nodes of the profile
      if (!url.includes('/src/')) continue;
      const key = `${functionName}@${url}`;
      if (seen.has(key)) continue;
      seen.add(key);
      const entry = inclusive.get(key) ?? { name: functionName || '(anonymous)', where: shortUrl(url), us: 0 };
      entry.us += profile.timeDeltas[i] ?? 0;
      inclusive.set(key, entry);
    }
  });
  const busyUs = totalUs - idleUs;
  const pct = (us: number) => (busyUs > 0 ? (100 * us) / busyUs : 0);
  return {
    totalMs: totalUs / 1000,
    idleMs: idleUs / 1000,
    functions: [...fn.values()]
      .filter((e) => e.name !== '(idle)')
      .sort((a, b) => b.us - a.us)
      .slice(0, top)
      .map((e) => ({ name: e.name, where: e.where, selfMs: e.us / 1000, pct: pct(e.us) })),
    files: [...file.entries()]
      .filter(([f]) => f !== '(idle)')
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([f, us]) => ({ file: f, selfMs: us / 1000, pct: pct(us) })),
    project: [...inclusive.values()]
      .sort((a, b) => b.us - a.us)
      .slice(0, top)
      .map((e) => ({ name: e.name, where: e.where, totalMs: e.us / 1000, pct: pct(e.us) })),
  };
}

/** Prints the summary of a profile file, or of the busiest profile in a --cpu-prof-dir (the main thread). */
export function printProfile(path: string, top = 15): ProfileSummary {
  const files = statSync(path).isDirectory() ? readdirSync(path).map((f) => join(path, f)) : [path];
  const summaries = files.map((f) => ({ f, s: summarizeProfile(JSON.parse(readFileSync(f, 'utf8')) as Profile, top) }));
  const { f: file, s: summary } = summaries.sort((a, b) => b.s.totalMs - b.s.idleMs - (a.s.totalMs - a.s.idleMs))[0];
  path = file;
  console.log(`\nCPU profile ${path}: ${summary.totalMs.toFixed(0)} ms sampled, ${summary.idleMs.toFixed(0)} ms idle; % of busy time`);
  printTable(
    ['self ms', '%', 'function', 'where'],
    summary.functions.map((f) => [f.selfMs.toFixed(1), f.pct.toFixed(1), f.name, f.where]),
  );
  console.log('');
  printTable(
    ['self ms', '%', 'file / package'],
    summary.files.map((f) => [f.selfMs.toFixed(1), f.pct.toFixed(1), f.file]),
  );
  console.log('');
  printTable(
    ['total ms', '%', 'project function (inclusive)', 'where'],
    summary.project.map((f) => [f.totalMs.toFixed(1), f.pct.toFixed(1), f.name, f.where]),
  );
  return summary;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const [path, top] = process.argv.slice(2);
  if (!path) throw new Error('usage: tsx bench/lib/cpuProfile.ts FILE.cpuprofile [top]');
  printProfile(path, Number(top ?? 15));
}
