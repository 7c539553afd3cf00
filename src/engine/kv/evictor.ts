/**
 * Dynamo's LRU evictor with a monotonic counter: `evict` returns the least recently inserted item. Items are
 * small non-negative integers (the block manager's slots), kept in a doubly linked list through typed arrays:
 * every operation is O(1) and allocates nothing (a Map reallocates its table as items come and go).
 */
export class LruEvictor<T extends number = number> {
  /** Per item: the next older and newer item (-1: none), and whether it is in the set. */
  private older = new Int32Array(16);
  private newer = new Int32Array(16);
  private member = new Uint8Array(16);
  private oldest = -1;
  private newest = -1;
  private count = 0;

  /** Inserts `item` as the newest (re-inserting moves it to the back). */
  insert(item: T): void {
    if (!(Number.isInteger(item) && item >= 0)) throw new Error(`LRU items are non-negative integers, got ${item}`);
    if (item >= this.member.length) this.grow(item);
    this.remove(item);
    this.member[item] = 1;
    this.older[item] = this.newest;
    this.newer[item] = -1;
    if (this.newest >= 0) this.newer[this.newest] = item;
    else this.oldest = item;
    this.newest = item;
    this.count++;
  }

  /** Removes and returns the oldest item, or undefined when empty. */
  evict(): T | undefined {
    const item = this.oldest;
    if (item < 0) return undefined;
    this.remove(item as T);
    return item as T;
  }

  remove(item: T): boolean {
    if (!this.has(item)) return false;
    const older = this.older[item];
    const newer = this.newer[item];
    if (older >= 0) this.newer[older] = newer;
    else this.oldest = newer;
    if (newer >= 0) this.older[newer] = older;
    else this.newest = older;
    this.member[item] = 0;
    this.count--;
    return true;
  }

  has(item: T): boolean {
    return this.member[item] === 1;
  }

  get size(): number {
    return this.count;
  }

  /** Oldest first. */
  *values(): IterableIterator<T> {
    for (let item = this.oldest; item >= 0; item = this.newer[item]) yield item as T;
  }

  private grow(item: number): void {
    const length = Math.max(item + 1, this.member.length * 2);
    const older = new Int32Array(length);
    older.set(this.older);
    const newer = new Int32Array(length);
    newer.set(this.newer);
    const member = new Uint8Array(length);
    member.set(this.member);
    this.older = older;
    this.newer = newer;
    this.member = member;
  }
}
