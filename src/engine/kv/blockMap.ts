// biome-ignore-all lint/suspicious/noSelfCompare: an empty slot holds NaN, and `k !== k` is the hot path's NaN test
/**
 * A map from block ids to non-negative integers: open addressing with linear probing over typed arrays. Block
 * ids are 53-bit numbers (chained hashes) or small negatives; a Map keyed by them boxes every key it stores and
 * follows pointers on every lookup, and a trace replay looks blocks up tens of millions of times.
 */

/** A block id's bits, for hashing both 32-bit halves. */
const idBits = new Float64Array(1);
const idWords = new Uint32Array(idBits.buffer);

export class BlockMap {
  /** Keys by table entry; NaN (never a block id) marks an empty entry. */
  private keys: Float64Array;
  private values: Int32Array;
  private mask: number;
  private shift: number;
  private count = 0;

  constructor(expected = 8) {
    const bits = Math.max(4, Math.ceil(Math.log2(expected * 2)));
    this.keys = new Float64Array(1 << bits).fill(NaN);
    this.values = new Int32Array(1 << bits);
    this.mask = (1 << bits) - 1;
    this.shift = 32 - bits;
  }

  get size(): number {
    return this.count;
  }

  private home(id: number): number {
    idBits[0] = id;
    return Math.imul(idWords[0] ^ Math.imul(idWords[1], 0x85ebca6b), 0x9e3779b1) >>> this.shift;
  }

  /** The entry holding `id`, or the empty entry where it would go. */
  private entry(id: number): number {
    let i = this.home(id);
    for (;;) {
      const key = this.keys[i];
      if (key === id || key !== key) return i;
      i = (i + 1) & this.mask;
    }
  }

  /** The value of `id`, or -1. */
  get(id: number): number {
    const i = this.entry(id);
    return this.keys[i] === id ? this.values[i] : -1;
  }

  has(id: number): boolean {
    return this.keys[this.entry(id)] === id;
  }

  set(id: number, value: number): void {
    const i = this.entry(id);
    if (this.keys[i] !== id) {
      // At most half full, so probes stay short.
      if (2 * (this.count + 1) > this.keys.length) {
        this.grow();
        this.set(id, value);
        return;
      }
      this.keys[i] = id;
      this.count++;
    }
    this.values[i] = value;
  }

  /** Removes `id`, shifting later entries of its probe run back: the table keeps no tombstones. */
  delete(id: number): boolean {
    let hole = this.entry(id);
    if (this.keys[hole] !== id) return false;
    for (let i = (hole + 1) & this.mask; this.keys[i] === this.keys[i]; i = (i + 1) & this.mask) {
      // An entry moves into the hole when the hole lies between its home and where it sits.
      const home = this.home(this.keys[i]);
      if (((i - home) & this.mask) >= ((i - hole) & this.mask)) {
        this.keys[hole] = this.keys[i];
        this.values[hole] = this.values[i];
        hole = i;
      }
    }
    this.keys[hole] = NaN;
    this.count--;
    return true;
  }

  clear(): void {
    this.keys.fill(NaN);
    this.count = 0;
  }

  private grow(): void {
    const { keys, values } = this;
    const bits = 33 - this.shift;
    this.keys = new Float64Array(1 << bits).fill(NaN);
    this.values = new Int32Array(1 << bits);
    this.mask = (1 << bits) - 1;
    this.shift = 32 - bits;
    this.count = 0;
    for (let i = 0; i < keys.length; i++) if (keys[i] === keys[i]) this.set(keys[i], values[i]);
  }
}
