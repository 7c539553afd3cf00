import { hideTokenIds } from '../capture/forward.js';
import type { StoredExchange } from '../store/captureStore.js';
import { LruCache } from '../util/lruCache.js';
import { stampedPrefix, splitStamp } from '../api/render.js';

/** One captured SSE event around its `id`/`created` stamp: `lead` + stamp + `tail` (no stamp: `lead` is all of it). */
interface EventParts {
  lead: Buffer;
  /** Its stamp's index in `CapturedStream.objects` (undefined: the event has no stamp). */
  kind: number | undefined;
  tail: Buffer;
}

/**
 * One layout of a captured stream for stamps of given lengths: every event's bytes with holes where its stamp
 * goes, the holes' offsets and stamp kinds, and where each event ends (the same for every response of it).
 */
interface Template {
  bytes: Buffer;
  holes: Uint32Array;
  /** Per hole, its stamp's index in `CapturedStream.objects`. */
  kinds: Uint16Array;
  ends: Uint32Array;
}

/**
 * A captured stream's events split once at their stamps (and with the injected token ids hidden once) into their
 * UTF-8 bytes. A response copies the layout for its stamps' lengths whole and writes its stamps into the holes:
 * one copy and one small write per event, no string built or encoded per response (ids of one server keep one
 * length, so one layout serves them all). Each release of events is then one `write` of a slice of it.
 */
class CapturedStream {
  private readonly parts: EventParts[];
  /** The stamps' distinct `object`s (null: a stamp with only the id), by the index events and holes name. */
  private readonly objects: (string | null)[] = [];
  /** By the stamps' lengths (a client's X-Request-Id sets the id's): a few, not one per length ever seen. */
  private readonly templates = new LruCache<string, Template>(4);

  constructor(ex: StoredExchange, hide: boolean) {
    this.parts = ex.eventEnds.map((end, i) => {
      const text = ex.responseBody.toString('utf8', i === 0 ? 0 : ex.eventEnds[i - 1], end);
      const { lead, object, tail } = splitStamp(hide ? hideTokenIds(text) : text);
      let kind: number | undefined;
      if (object !== undefined) {
        kind = this.objects.indexOf(object);
        if (kind < 0) kind = this.objects.push(object) - 1;
      }
      return { lead: Buffer.from(lead, 'utf8'), kind, tail: Buffer.from(tail, 'utf8') };
    });
  }

  /** This response's bytes, with the byte offset where each event ends. */
  render(id: string, created: number): RenderedStream {
    const stamps = this.objects.map((object) => Buffer.from(stampedPrefix(id, object, created), 'utf8'));
    const lengths = stamps.map((stamp) => stamp.length).join(',');
    let template = this.templates.get(lengths);
    if (!template) this.templates.set(lengths, (template = this.layout(stamps)));
    const bytes = Buffer.allocUnsafe(template.bytes.length);
    bytes.set(template.bytes);
    const { holes, kinds } = template;
    for (let h = 0; h < holes.length; h++) bytes.set(stamps[kinds[h]], holes[h]);
    return new RenderedStream(bytes, template.ends);
  }

  /** The events with these stamps in their holes (what a response overwrites), and where holes and events are. */
  private layout(stamps: Buffer[]): Template {
    const pieces: Buffer[] = [];
    const holes: number[] = [];
    const kinds: number[] = [];
    const ends = new Uint32Array(this.parts.length);
    let offset = 0;
    this.parts.forEach(({ lead, kind, tail }, i) => {
      pieces.push(lead);
      offset += lead.length;
      if (kind !== undefined) {
        holes.push(offset);
        kinds.push(kind);
        pieces.push(stamps[kind]);
        offset += stamps[kind].length;
      }
      pieces.push(tail);
      offset += tail.length;
      ends[i] = offset;
    });
    return { bytes: Buffer.concat(pieces, offset), holes: Uint32Array.from(holes), kinds: Uint16Array.from(kinds), ends };
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
