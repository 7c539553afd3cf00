/** mulberry32: a tiny seeded generator of u32s, the same sequence on every machine (simulation draws, not security). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  };
}

/** Seeded floats in [0, 1). */
export function seededUniform(seed: number): () => number {
  const next = mulberry32(seed);
  return () => next() / 2 ** 32;
}
