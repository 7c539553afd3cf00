/**
 * The formatter and linter `npm test` runs (Biome, with the project's biome.jsonc) fail on a violation: a file
 * formatted otherwise, code a recommended rule forbids, and a function in src/ over 120 lines (issue 37's limit),
 * each in a copy of the configuration.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { testTmpdir } from '../support/tempRoot.js';

const ROOT = join(import.meta.dirname, '..', '..');
const BIOME = join(ROOT, 'node_modules', '.bin', 'biome');

/** `biome ci` over one source file in a directory laid out as the project (src/), with the project's configuration. */
function biomeCi(source: string): { status: number | null; output: string } {
  const dir = mkdtempSync(join(testTmpdir(), 'lint-'));
  copyFileSync(join(ROOT, 'biome.jsonc'), join(dir, 'biome.jsonc'));
  mkdirSync(join(dir, 'src'));
  writeFileSync(join(dir, 'src', 'example.ts'), source);
  const run = spawnSync(BIOME, ['ci', '--colors=off', '--error-on-warnings', '.'], { cwd: dir, encoding: 'utf8' });
  return { status: run.status, output: run.stdout + run.stderr };
}

describe('npm test checks formatting and lint with Biome', () => {
  it('passes a file written in the house style', () => {
    const run = biomeCi("export const greeting = (name: string): string => ['Hello', name].join(', ');\n");
    expect(run.status, run.output).toBe(0);
  });

  it('fails a file formatted otherwise (double quotes, no semicolon), naming the file', () => {
    const run = biomeCi('export const greeting = "hello"\n');
    expect(run.status).not.toBe(0);
    expect(run.output).toMatch(/src\/example\.ts format/);
  });

  it('fails code a recommended rule forbids (comparing a value with itself), naming the rule', () => {
    const run = biomeCi('export function same(x: number): boolean {\n  return x === x;\n}\n');
    expect(run.status).not.toBe(0);
    expect(run.output).toContain('lint/suspicious/noSelfCompare');
  });

  it('fails a function in src/ longer than 120 lines (its body), naming the rule; one of 120 passes', () => {
    /** A function whose body is `lines` lines long. */
    const fn = (lines: number) =>
      `export function long(x: number): number {\n${Array.from({ length: lines - 1 }, (_, i) => `  x += ${i};\n`).join('')}  return x;\n}\n`;
    expect(biomeCi(fn(120)).status).toBe(0);
    const run = biomeCi(fn(121));
    expect(run.status).not.toBe(0);
    expect(run.output).toContain('lint/complexity/noExcessiveLinesPerFunction');
  });
});
