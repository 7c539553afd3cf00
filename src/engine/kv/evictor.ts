/**
 * Dynamo's LRU evictor with a monotonic counter: `evict` returns the least recently inserted item.
 * A Map keeps insertion order, which is exactly counter order, so every operation is O(1).
 */
export class LruEvictor<T> {
  private readonly items = new Map<T, true>();
  /**
   * Reused across evictions (no iterator allocated per eviction): entries only ever join at the end, so
   * everything still in the map lies after its position. Recreated once exhausted.
   */
  private oldest: IterableIterator<T> | null = null;

  /** Inserts `item` as the newest (re-inserting moves it to the back). */
  insert(item: T): void {
    this.items.delete(item);
    this.items.set(item, true);
  }

  /** Removes and returns the oldest item, or undefined when empty. */
  evict(): T | undefined {
    let next = this.oldest?.next();
    if (!next || next.done) {
      this.oldest = this.items.keys();
      next = this.oldest.next();
      if (next.done) return undefined;
    }
    this.items.delete(next.value);
    return next.value;
  }

  remove(item: T): boolean {
    return this.items.delete(item);
  }

  has(item: T): boolean {
    return this.items.has(item);
  }

  get size(): number {
    return this.items.size;
  }

  /** Oldest first. */
  values(): IterableIterator<T> {
    return this.items.keys();
  }
}
