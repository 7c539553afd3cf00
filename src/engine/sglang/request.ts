import type { CoreRequest, RequestStatus } from '../contract.js';
import type { RadixNode } from './radixCache.js';

/**
 * One request's SGLang scheduling state (engine-reference §2.2, Dynamo's `SglangRequest`). Invariants, checked
 * by `SglangCore.kvAudit`: one pool slot per materialized token (`kv[0, kvLength)`); the first `cachedTokens`
 * of them (page-aligned) are the radix tree's, on the path from the root to `lastNode`, which this request
 * locks; the rest are its own. `allocatedTokens` is the page-rounded reservation (less than a page above
 * `kvLength`).
 */
export class SglangRequest {
  readonly promptLength: number;
  readonly maxOutput: number;
  outputLength = 0;
  /** Prompt then output token ids (allocated when first needed; the outputs are written as they come). */
  private tokenIds: Uint32Array | null = null;
  /**
   * Pool slot of each materialized token (allocated at the first admission). Tree nodes view parts of it, so
   * it is only ever appended to; a retracted request starts over with a fresh one.
   */
  kv: Int32Array | null = null;
  kvLength = 0;
  cachedTokens = 0;
  allocatedTokens = 0;
  /** The deepest tree node of the cached prefix, locked by this request; null while it holds nothing. */
  lastNode: RadixNode | null = null;
  status: RequestStatus = 'waiting';
  retractions = 0;
  /** Its prompt's KV comes from a prefill engine (until a retraction loses it): allocated, not computed. */
  remoteKv: boolean;

  constructor(readonly request: CoreRequest) {
    this.promptLength = request.promptTokenIds.length;
    this.maxOutput = request.maxOutputTokens;
    this.remoteKv = request.remotePrefill === true;
  }

  get id(): string {
    return this.request.id;
  }

  /** Prompt plus the outputs so far (SGLang's current sequence). */
  get length(): number {
    return this.promptLength + this.outputLength;
  }

  /** Tokens still to prefill (extend_input_len). */
  get extendLength(): number {
    return this.length - this.kvLength;
  }

  get remainingOutput(): number {
    return this.maxOutput - this.outputLength;
  }

  /** Reserved but not yet materialized tokens of the last page. */
  get extraReserved(): number {
    return this.allocatedTokens - this.kvLength;
  }

  get tokens(): Uint32Array {
    if (this.tokenIds === null) {
      this.tokenIds = new Uint32Array(this.promptLength + this.maxOutput);
      this.tokenIds.set(this.request.promptTokenIds);
    }
    return this.tokenIds;
  }

  /** The slot array, sized once for the whole sequence. */
  slots(): Int32Array {
    if (this.kv === null) this.kv = new Int32Array(this.promptLength + this.maxOutput);
    return this.kv;
  }

  appendOutput(token: number): void {
    this.tokens[this.length] = token;
    this.outputLength++;
  }
}
