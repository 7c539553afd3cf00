/**
 * The block manager's and KV router's id map (open addressing over typed arrays) against a JS Map, under
 * random inserts, updates and deletes of chained-hash-sized ids and small negative ones, through its growth.
 */
import { describe, expect, it } from 'vitest';
import { BlockMap } from '../../src/engine/kv/blockMap.js';
import { mulberry32 } from '../../src/util/mulberry32.js';

describe('BlockMap', () => {
  it('agrees with a Map through 30,000 random operations', () => {
    const random = mulberry32(7);
    // 53-bit ids like chained hashes, and the small negative ids of partial blocks.
    const ids = Array.from({ length: 3000 }, (_, i) => (i % 4 === 0 ? -(i + 1) : (random() % 0x200000) * 0x100000000 + random()));
    const map = new BlockMap();
    const oracle = new Map<number, number>();
    for (let op = 0; op < 30_000; op++) {
      const id = ids[random() % ids.length];
      const roll = random() % 100;
      if (roll < 50) {
        const value = random() % 1000;
        map.set(id, value);
        oracle.set(id, value);
      } else if (roll < 80) {
        expect(map.delete(id)).toBe(oracle.delete(id));
      } else {
        expect(map.get(id)).toBe(oracle.get(id) ?? -1);
        expect(map.has(id)).toBe(oracle.has(id));
      }
      expect(map.size).toBe(oracle.size);
    }
    for (const id of ids) expect(map.get(id)).toBe(oracle.get(id) ?? -1);
  });

  it('finds every remaining id after deletes that shift later entries of a probe run back', () => {
    // 200 ids in a table of 512 entries (no growth): many share probe runs.
    const map = new BlockMap(256);
    const ids = Array.from({ length: 200 }, (_, i) => i * 0x100000000 + 12345);
    ids.forEach((id, i) => map.set(id, i));
    for (let i = 0; i < ids.length; i += 3) expect(map.delete(ids[i])).toBe(true);
    ids.forEach((id, i) => expect(map.get(id)).toBe(i % 3 === 0 ? -1 : i));
    map.clear();
    expect([map.size, map.has(ids[1])]).toEqual([0, false]);
  });
});
