/**
 * Rolling hashes of token ids, for what a trace needs to know of prompts without their text: whether one prompt
 * is a prefix of another (sessions rebuilt from a capture) and which blocks two prompts share (the hash ids of a
 * converted trace).
 */

/** Two polynomial hashes modulo primes below 2^31; bases below 2^21 keep `h × base + id` exact in a double. */
const P1 = 2147483647;
const P2 = 2147483629;
const BASE1 = 1000003;
const BASE2 = 1500007;
const LOW22 = 0x400000;

/**
 * The hash of the ids pushed so far, read at any length as one safe integer (53 bits: equal prefixes have equal
 * keys; distinct ones share a key by a chance of about 2^-53 per pair). Read at each block end it is a chain: a
 * block's key is its ids hashed on top of the key before it, so equal keys mean equal prompts up to there.
 */
export class PrefixHash {
  private h1 = 0;
  private h2 = 0;

  push(id: number): void {
    this.h1 = (this.h1 * BASE1 + (id % P1)) % P1;
    this.h2 = (this.h2 * BASE2 + (id % P2)) % P2;
  }

  key(): number {
    return this.h1 * LOW22 + (this.h2 % LOW22);
  }
}

/**
 * Dynamo's RollingHashIdMapper: the hash ids of prompts as a Mooncake trace gives them — one per `blockSize`
 * tokens, the trailing partial block included, each naming the prompt up to its block's end (the chain), numbered
 * in first-seen order from 0 over every prompt given to this mapper (a file's).
 */
export class RollingHashIds {
  private readonly ids = new Map<number, number>();

  constructor(readonly blockSize: number) {
    if (!(Number.isInteger(blockSize) && blockSize >= 1)) throw new Error(`the trace block size must be an integer >= 1, got ${blockSize}`);
  }

  of(tokens: ArrayLike<number>): number[] {
    const hash = new PrefixHash();
    const out: number[] = [];
    for (let i = 0; i < tokens.length; i++) {
      hash.push(tokens[i]);
      if ((i + 1) % this.blockSize === 0 || i === tokens.length - 1) {
        const key = hash.key();
        let id = this.ids.get(key);
        if (id === undefined) {
          id = this.ids.size;
          this.ids.set(key, id);
        }
        out.push(id);
      }
    }
    return out;
  }
}
