import { hideTokenIds } from '../capture/forward.js';
import type { StoredExchange } from '../store/captureStore.js';
import { stampedPrefix, splitStamp } from './render.js';

/** One captured SSE event around its `id`/`created` stamp: `lead` + stamp + `tail` (no stamp: `lead` is all of it). */
interface EventParts {
  lead: string;
  /** The stamp's `object` (null: a stamp with only the id; undefined: the event has no stamp). */
  object: string | null | undefined;
  tail: string;
  /** UTF-8 bytes of lead + tail. */
  fixedBytes: number;
}

/**
 * A captured stream's events split once at their stamps (and with the injected token ids hidden once), so each
 * response is one join and one UTF-8 encoding, and each release of events one `write` of a slice of it.
 */
class CapturedStream {
  private readonly parts: EventParts[];

  constructor(ex: StoredExchange, hide: boolean) {
    this.parts = ex.eventEnds.map((end, i) => {
      const text = ex.responseBody.toString('utf8', i === 0 ? 0 : ex.eventEnds[i - 1], end);
      const parts = splitStamp(hide ? hideTokenIds(text) : text);
      return { ...parts, fixedBytes: Buffer.byteLength(parts.lead) + Buffer.byteLength(parts.tail) };
    });
  }

  /** This response's bytes, with the byte offset where each event ends. */
  render(id: string, created: number): RenderedStream {
    const stamps = new Map<string | null, { text: string; bytes: number }>();
    const texts: string[] = [];
    const ends = new Uint32Array(this.parts.length);
    let offset = 0;
    this.parts.forEach((p, i) => {
      let stampBytes = 0;
      texts.push(p.lead);
      if (p.object !== undefined) {
        let stamp = stamps.get(p.object);
        if (!stamp) {
          const text = stampedPrefix(id, p.object, created);
          stamp = { text, bytes: Buffer.byteLength(text) };
          stamps.set(p.object, stamp);
        }
        texts.push(stamp.text);
        stampBytes = stamp.bytes;
      }
      texts.push(p.tail);
      offset += p.fixedBytes + stampBytes;
      ends[i] = offset;
    });
    return new RenderedStream(Buffer.from(texts.join(''), 'utf8'), ends);
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
