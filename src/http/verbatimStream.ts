import { hideTokenIds } from '../capture/forward.js';
import type { StoredExchange } from '../store/captureStore.js';
import { stampedPrefix, splitStamp } from './render.js';

/** One captured SSE event around its `id`/`created` stamp: `lead` + stamp + `tail` (no stamp: `lead` is all of it). */
interface EventParts {
  lead: Buffer;
  /** The stamp's `object` (null: a stamp with only the id; undefined: the event has no stamp). */
  object: string | null | undefined;
  tail: Buffer;
}

/**
 * A captured stream's events split once at their stamps (and with the injected token ids hidden once) into their
 * UTF-8 bytes, so each response is one buffer of copied segments with its stamps in between (no string built or
 * encoded per response), and each release of events one `write` of a slice of it.
 */
class CapturedStream {
  private readonly parts: EventParts[];
  /** Bytes of every lead and tail; and how many events carry each kind of stamp. */
  private readonly fixedBytes: number;
  private readonly stampsOf = new Map<string | null, number>();

  constructor(ex: StoredExchange, hide: boolean) {
    let fixed = 0;
    this.parts = ex.eventEnds.map((end, i) => {
      const text = ex.responseBody.toString('utf8', i === 0 ? 0 : ex.eventEnds[i - 1], end);
      const { lead, object, tail } = splitStamp(hide ? hideTokenIds(text) : text);
      const parts = { lead: Buffer.from(lead, 'utf8'), object, tail: Buffer.from(tail, 'utf8') };
      fixed += parts.lead.length + parts.tail.length;
      if (object !== undefined) this.stampsOf.set(object, (this.stampsOf.get(object) ?? 0) + 1);
      return parts;
    });
    this.fixedBytes = fixed;
  }

  /** This response's bytes, with the byte offset where each event ends. */
  render(id: string, created: number): RenderedStream {
    const stamps = new Map<string | null, Buffer>();
    let total = this.fixedBytes;
    for (const [object, count] of this.stampsOf) {
      const stamp = Buffer.from(stampedPrefix(id, object, created), 'utf8');
      stamps.set(object, stamp);
      total += stamp.length * count;
    }
    const bytes = Buffer.allocUnsafe(total);
    const ends = new Uint32Array(this.parts.length);
    let offset = 0;
    for (let i = 0; i < this.parts.length; i++) {
      const p = this.parts[i];
      bytes.set(p.lead, offset);
      offset += p.lead.length;
      if (p.object !== undefined) {
        const stamp = stamps.get(p.object) as Buffer;
        bytes.set(stamp, offset);
        offset += stamp.length;
      }
      bytes.set(p.tail, offset);
      offset += p.tail.length;
      ends[i] = offset;
    }
    return new RenderedStream(bytes, ends);
  }
}

/** One response's stream: events [from, to) as one buffer (a view, no copy). */
export class RenderedStream {
  constructor(
    private readonly bytes: Buffer,
    private readonly ends: Uint32Array,
  ) {}

  get events(): number {
    return this.ends.length;
  }

  slice(from: number, to: number): Buffer {
    return this.bytes.subarray(from === 0 ? 0 : this.ends[from - 1], to === 0 ? 0 : this.ends[to - 1]);
  }
}

const cache = new WeakMap<StoredExchange, Map<boolean, CapturedStream>>();

/** A capture's stream, restamped for one response; its split is computed once per capture and `hide`. */
export function renderCapturedStream(ex: StoredExchange, hide: boolean, id: string, created: number): RenderedStream {
  let variants = cache.get(ex);
  if (!variants) cache.set(ex, (variants = new Map()));
  let stream = variants.get(hide);
  if (!stream) variants.set(hide, (stream = new CapturedStream(ex, hide)));
  return stream.render(id, created);
}
