/**
 * docs/client-matrix.md cannot go stale: its table lists exactly the matrix's cells (every target of every
 * client × scenario that test/clients/client-matrix.test.ts runs) and the clients it does not run yet.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { matrixCells, NOT_YET, TARGETS, tableCells } from '../support/clientMatrix.js';

const doc = readFileSync(join(import.meta.dirname, '..', '..', 'docs', 'client-matrix.md'), 'utf8');

describe('docs/client-matrix.md', () => {
  it("lists exactly the matrix's cells, each passed or failed, and the clients not run yet", () => {
    const { cells, notYet } = tableCells(doc);
    const expected = TARGETS.flatMap((target) => matrixCells().map(({ client, scenario }) => `${target} / ${client} / ${scenario}`));
    expect([...cells].sort()).toEqual([...expected].sort());
    expect(notYet).toEqual(Object.keys(NOT_YET));
  });

  it('is linked from the README', () => {
    expect(readFileSync(join(import.meta.dirname, '..', '..', 'README.md'), 'utf8')).toContain('(docs/client-matrix.md)');
  });
});
