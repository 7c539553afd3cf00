/**
 * Processes and their CPU time from Linux's /proc (proc(5)): what a benchmark or test reads of the processes a
 * server started (`capture --threads`' forwarding processes). Empty where there is no /proc.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';

/** /proc/PID/stat's fields after "(comm) ": state, ppid, …, so proc(5)'s field n is at index n − 3. */
function statFields(pid: number): string[] {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
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

/** User and system CPU time of a process in clock ticks (proc(5) fields 14 and 15; 100 ticks a second). */
export function cpuTicks(pid: number): number {
  const fields = statFields(pid);
  return Number(fields[11]) + Number(fields[12]);
}
