import { readFileSync } from 'node:fs';

/** Clock ticks per second of /proc stat files (USER_HZ, 100 on Linux). */
export const TICKS_PER_S = 100;

/**
 * CPU time in clock ticks (user + system) from a proc(5) stat file: /proc/<pid>/stat for a process,
 * /proc/<pid>/task/<tid>/stat for one of its threads (fields 14 and 15).
 */
export function cpuTicks(statFile: string): number {
  const stat = readFileSync(statFile, 'utf8');
  // The command name (field 2) is in parentheses and may hold spaces: count fields after its ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]);
}
