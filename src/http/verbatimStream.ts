import { setTimeout as delay } from 'node:timers/promises';
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

/** The timing a captured stream's events were recorded with: offsets from the request's start, cumulative tokens. */
type CapturedEvents = Pick<StoredExchange, 'eventTimes' | 'eventTokens'>;

/** Resolves after `ms` or when `signal` aborts, whichever comes first (the timer cleared either way). */
async function pause(ms: number, signal: AbortSignal): Promise<void> {
  await delay(ms, undefined, { signal }).catch(() => undefined);
}

/** Whether `step` settles within `ms` (false when the time, or `signal`, comes first). */
async function settlesWithin(step: Promise<unknown>, ms: number, signal: AbortSignal): Promise<boolean> {
  const timer = new AbortController();
  const stop = () => timer.abort();
  signal.addEventListener('abort', stop, { once: true });
  try {
    return await Promise.race([step.then(() => true), pause(ms, timer.signal).then(() => false)]);
  } finally {
    timer.abort();
    signal.removeEventListener('abort', stop);
  }
}

/**
 * When a captured stream's events go out, as how many of them are due (non-decreasing). An event carrying tokens
 * goes when the engine has emitted them. One carrying none — a role chunk before the first token, a finish, usage
 * or `[DONE]` after the last — goes with its neighbours, or, when `pace` is given (timing `captured`: a captured
 * duration as served), at its captured gap after the last event that carried tokens (the request's arrival
 * before any): the engine decides when tokens come, the capture how long after them the rest follows. An event
 * never goes before one ahead of it.
 */
export async function* eventReleases(
  ex: CapturedEvents,
  emittedCounts: AsyncIterator<number>,
  arrivalMs: number,
  pace: ((capturedMs: number) => number) | undefined,
  signal: AbortSignal,
): AsyncGenerator<number> {
  const events = ex.eventTokens.length;
  const carriesTokens = (i: number) => ex.eventTokens[i] > (i === 0 ? 0 : ex.eventTokens[i - 1]);
  let next = 0;
  let emitted = 0;
  let anchorMs = arrivalMs;
  let anchorOffset = 0;
  // Marked handled at once: a failure is seen when awaited, and never unhandled if the client left before.
  const nextCount = () => {
    const step = emittedCounts.next();
    step.catch(() => undefined);
    return step;
  };
  let pending: Promise<IteratorResult<number>> | null = nextCount();
  while (next < events && !signal.aborted) {
    if (pace && !carriesTokens(next)) {
      const waitMs = anchorMs + pace(ex.eventTimes[next] - anchorOffset) - performance.now();
      // A token that comes first takes the events ahead of it along (below).
      const tokenFirst = waitMs > 0 && pending !== null && (await settlesWithin(pending, waitMs, signal));
      if (!tokenFirst) {
        if (waitMs > 0 && pending === null) await pause(waitMs, signal);
        yield ++next;
        continue;
      }
    }
    if (pending === null) {
      yield (next = events);
      return;
    }
    const step = await pending;
    if (step.done) {
      pending = null;
      if (!pace) yield (next = events);
      continue;
    }
    pending = nextCount();
    emitted = step.value;
    let to = next;
    let last = -1;
    for (let i = next; i < events && ex.eventTokens[i] <= emitted && emitted > 0; i++) {
      if (!pace) to = i + 1;
      else if (carriesTokens(i)) to = (last = i) + 1;
    }
    if (last >= 0) {
      anchorMs = performance.now();
      anchorOffset = ex.eventTimes[last];
    }
    if (to > next) yield (next = to);
  }
}
