/**
 * Processes, threads and their CPU time from Linux's /proc (proc(5)): what a benchmark or test reads of the
 * processes a server started (`capture --threads`' forwarding processes) and of a process's threads. Empty where
 * there is no /proc.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';

/** Clock ticks per second of /proc stat files (USER_HZ, 100 on Linux). */
export const TICKS_PER_S = 100;

/**
 * The fields of /proc/PID/stat (or /proc/PID/task/TID/stat for one thread) after "(comm) ": state, ppid, …, so
 * proc(5)'s field n is at index n − 3. The command name may hold spaces: fields are counted after its ')'.
 */
function statFields(pid: number, tid?: number): string[] {
  const stat = readFileSync(tid === undefined ? `/proc/${pid}/stat` : `/proc/${pid}/task/${tid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

/** The processes whose parent is `pid`. */
export function childrenOf(pid: number): number[] {
  if (!existsSync('/proc/self/stat')) return [];
  return readdirSync('/proc')
    .filter((entry) => /^\d+$/.test(entry))
    .flatMap((entry) => {
      try {
        return statFields(Number(entry))[1] === String(pid) ? [Number(entry)] : [];
      } catch {
        return []; // gone meanwhile
      }
    });
}

/** The thread ids of process `pid`. */
export function threadsOf(pid: number): number[] {
  return readdirSync(`/proc/${pid}/task`).map(Number);
}

/**
 * User and system CPU time in clock ticks (proc(5) fields 14 and 15) of process `pid`, or of its thread `tid`
 * (the main thread's id is the process's).
 */
export function cpuTicks(pid: number, tid?: number): number {
  const fields = statFields(pid, tid);
  return Number(fields[11]) + Number(fields[12]);
}

/** `cpuTicks` in milliseconds. */
export function cpuMs(pid: number, tid?: number): number {
  return (cpuTicks(pid, tid) * 1000) / TICKS_PER_S;
}
