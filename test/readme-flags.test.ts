/**
 * The README's CLI tables and the built CLI name the same flags: every flag a command accepts (its `--help`) is
 * documented in that command's table, and every flag a table documents is accepted.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const ROOT = join(import.meta.dirname, '..');
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');

/** The flags of the table that follows the line "`mocker <command>…`" in the README's CLI section. */
function documentedFlags(command: string): string[] {
  const cli = README.slice(README.indexOf('\n## CLI'));
  const heading = new RegExp(`^\`mocker ${command}[^\`]*\`\\s*$`, 'm').exec(cli);
  if (!heading) throw new Error(`README: no table for mocker ${command}`);
  const rows = cli.slice(heading.index + heading[0].length).trimStart().split('\n');
  const table = rows.slice(0, rows.findIndex((row) => !row.startsWith('|')));
  const flags = table.slice(2).flatMap((row) => {
    const firstCell = row.split(/(?<!\\)\|/)[1];
    // `--[no-]x` documents --x and --no-x.
    return [...firstCell.matchAll(/--(\[no-\])?([a-z][a-z0-9-]*)/g)].flatMap((m) => (m[1] ? [`--${m[2]}`, `--no-${m[2]}`] : [`--${m[2]}`]));
  });
  return [...new Set(flags)].sort();
}

/** The flags the built CLI's `mocker <command> --help` lists (a subcommand: "captures list"), but --help itself. */
function acceptedFlags(command: string): string[] {
  const help = execFileSync(process.execPath, [join(ROOT, 'dist', 'cli', 'main.js'), ...command.split(' '), '--help'], { encoding: 'utf8', env: { ...process.env, COLUMNS: '400' } });
  const flags = [...help.matchAll(/^ {2}(?:-\w, )?(--[a-z][a-z0-9-]*)/gm)].map((m) => m[1]).filter((f) => f !== '--help');
  return [...new Set(flags)].sort();
}

describe("the README's CLI tables", () => {
  it.each(['serve', 'capture', 'trace', 'pd-proxy', 'captures list', 'captures show', 'captures export', 'captures import', 'captures merge', 'captures prune', 'captures stats', 'captures verify', 'captures diff', 'captures fit', 'rerun'])('mocker %s: the table documents exactly the flags the CLI accepts', (command) => {
    const accepted = acceptedFlags(command);
    // Every command has a flag (`captures show` has one, --json): an empty reading is a broken parse, not agreement.
    expect(accepted.length).toBeGreaterThan(0);
    expect(documentedFlags(command)).toEqual(accepted);
  });
});
