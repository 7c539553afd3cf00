import { chainHash, contentHash } from '../kv/fastHash.js';

/**
 * SGLang's radix cache over a token pool (engine-reference §2.4; sglang `mem_cache/radix_cache.py`, Dynamo's
 * `cache/radix_cache.rs`). Pure and clock-free: the LRU order comes from a counter bumped once per access
 * (match or insert), where SGLang and Dynamo read a wall clock.
 *
 * Sizes follow SGLang rather than Dynamo [S]: `evictableSize` counts every unlocked token in the tree (Dynamo
 * counts only the unlocked leaves'), so `evictableSize + protectedSize` is the tree's size and all of the
 * evictable part can really be evicted (locks run from a node to the root, so an unlocked node's subtree is
 * unlocked too).
 */

/** The KV pool's token slots: a stack of free slot indices; allocation is all or nothing. */
export class TokenPool {
  private readonly free: Int32Array;
  private top: number;

  constructor(readonly total: number) {
    this.free = new Int32Array(total);
    // Slots come out in ascending order from a fresh pool (easier to read in tests and traces).
    for (let i = 0; i < total; i++) this.free[i] = total - 1 - i;
    this.top = total;
  }

  get available(): number {
    return this.top;
  }

  /** Writes `count` free slots into `into[at, at + count)`; false (and nothing taken) when fewer are free. */
  allocate(into: Int32Array, at: number, count: number): boolean {
    if (count > this.top) return false;
    for (let i = 0; i < count; i++) into[at + i] = this.free[--this.top];
    return true;
  }

  /** Returns `slots[from, to)` to the pool. */
  release(slots: Int32Array, from: number, to: number): void {
    if (this.top + (to - from) > this.total) throw new Error('KV pool: more slots freed than it holds (a double free)');
    for (let i = from; i < to; i++) this.free[this.top++] = slots[i];
  }

  /** The free slots (audits). */
  freeSlots(): Int32Array {
    return this.free.subarray(0, this.top);
  }
}

export class RadixNode {
  lockRef = 0;
  /** A single child sits here; with more, they all sit in `children`. */
  onlyChild: RadixNode | null = null;
  children: Map<number, RadixNode> | null = null;
  childCount = 0;
  evicted = false;

  constructor(
    readonly id: number,
    public parent: RadixNode | null,
    /** The tokens of this edge (a whole number of pages). */
    public key: Uint32Array,
    /** Their KV pool slots, one per token. */
    public value: Int32Array,
    /**
     * The chained hash of each page (router block ids), when the cache hashes pages. Never changed in place
     * (a split slices it): the stored and removed events hand this very array out.
     */
    public pageHashes: readonly number[] | null,
    /** Tokens from the root to the end of this node. */
    public depth: number,
    /** The LRU stamp of its last access. */
    public lastAccess: number,
    /** The node's key in its parent: its first token (page size 1) or the content hash of its first page. */
    public childKey: number,
  ) {}

  /** The chained hash of this node's last page (null for the root). */
  lastPageHash(): number | null {
    const hashes = this.pageHashes;
    return hashes === null || hashes.length === 0 ? null : hashes[hashes.length - 1];
  }
}

/** Told when a node enters the tree (insert) and when eviction removes one: the cache's stored / removed events. */
export interface RadixCacheListener {
  stored(node: RadixNode): void;
  removed(node: RadixNode): void;
}

export interface RadixCacheOptions {
  /** Keep each page's chained hash (`chainHash(parent, contentHash(page))`): needed for KV events. */
  hashPages?: boolean;
  listener?: RadixCacheListener;
}

const EMPTY_TOKENS = new Uint32Array(0);
const EMPTY_SLOTS = new Int32Array(0);

export class RadixCache {
  readonly pool: TokenPool;
  readonly root: RadixNode;
  /** Tokens in unlocked nodes (all evictable, leaves first). */
  evictableSize = 0;
  /** Tokens in nodes some request has locked. */
  protectedSize = 0;
  private readonly hashPages: boolean;
  private readonly listener: RadixCacheListener | null;
  /** Bumped once per access: the LRU clock. */
  private clock = 0;
  private nextId = 1;
  private nodeCount = 0;
  /**
   * Candidate evictable leaves, a binary min-heap on (access stamp, id). Entries go stale when their node is
   * touched, locked, gains a child or is evicted, and are skipped when popped; a touched node is pushed again.
   */
  private heapNodes: RadixNode[] = [];
  private heapStamps: number[] = [];

  constructor(
    totalTokens: number,
    readonly pageSize: number,
    options: RadixCacheOptions = {},
  ) {
    if (!Number.isInteger(pageSize) || pageSize < 1) throw new Error(`page size must be an integer >= 1, got ${pageSize}`);
    if (!Number.isInteger(totalTokens) || totalTokens < 1) throw new Error(`the KV pool must hold a positive number of tokens, got ${totalTokens}`);
    this.pool = new TokenPool(totalTokens);
    this.hashPages = options.hashPages === true;
    this.listener = options.listener ?? null;
    this.root = new RadixNode(0, null, EMPTY_TOKENS, EMPTY_SLOTS, this.hashPages ? [] : null, 0, 0, 0);
  }

  get totalTokens(): number {
    return this.pool.total;
  }

  get availableTokens(): number {
    return this.pool.available;
  }

  /** Tokens held by the tree (locked or not). */
  get treeTokens(): number {
    return this.evictableSize + this.protectedSize;
  }

  /**
   * The longest cached prefix of `tokens[0, length)` in whole pages: walks the tree (splitting the node the
   * match ends inside, so the match ends on a node boundary), refreshes the path's access stamps and returns
   * the deepest matched node; its `depth` is the matched length (the root: nothing matched).
   */
  matchPrefix(tokens: Uint32Array, length: number): RadixNode {
    const end = this.pageFloor(length);
    const stamp = ++this.clock;
    let node = this.root;
    node.lastAccess = stamp;
    let pos = 0;
    while (pos < end) {
      const child = this.findChild(node, tokens, pos);
      if (child === null) break;
      this.touch(child, stamp);
      const matched = this.keyMatch(child, tokens, pos, end);
      pos += matched;
      if (matched < child.key.length) {
        node = this.split(child, matched, stamp);
        break;
      }
      node = child;
    }
    return node;
  }

  /** The cached prefix length of `tokens[0, length)` in whole pages, changing nothing (LPM scoring). */
  prefixMatchLength(tokens: Uint32Array, length: number): number {
    const end = this.pageFloor(length);
    let node = this.root;
    let pos = 0;
    while (pos < end) {
      const child = this.findChild(node, tokens, pos);
      if (child === null) break;
      const matched = this.keyMatch(child, tokens, pos, end);
      pos += matched;
      if (matched < child.key.length) break;
      node = child;
    }
    return pos;
  }

  /**
   * Inserts the whole pages of `tokens[from.depth, length)` below `from` (whose path holds
   * `tokens[0, from.depth)`). Where the tree already holds some of those tokens, the caller's slots for them
   * are duplicates: they go back to the pool and `slots` takes the tree's (sglang's cache_*_req free the
   * duplicates the same way). Returns the node ending at the last whole page; new nodes are unlocked.
   *
   * New nodes keep views of `tokens` and `slots`, not copies: the caller must never change what it inserted
   * (a request only appends, and takes fresh arrays when it starts over).
   */
  insert(from: RadixNode, tokens: Uint32Array, length: number, slots: Int32Array): RadixNode {
    const end = this.pageFloor(length);
    const stamp = ++this.clock;
    let node = from;
    let pos = from.depth;
    while (pos < end) {
      const child = this.findChild(node, tokens, pos);
      if (child === null) return this.createLeaf(node, tokens, pos, end, slots, stamp);
      this.touch(child, stamp);
      const matched = this.keyMatch(child, tokens, pos, end);
      const value = child.value;
      for (let i = 0; i < matched; i++) {
        const slot = slots[pos + i];
        if (slot !== value[i]) {
          this.pool.release(slots, pos + i, pos + i + 1);
          slots[pos + i] = value[i];
        }
      }
      pos += matched;
      node = matched < child.key.length ? this.split(child, matched, stamp) : child;
    }
    return node;
  }

  /**
   * Locks the path from `node` up to (not including) `stop` (default: up to the root): a request holds it.
   * Returns how many tokens this moved from evictable to protected.
   */
  lock(node: RadixNode, stop: RadixNode = this.root): number {
    let moved = 0;
    for (let n: RadixNode | null = node; n !== null && n !== stop && n !== this.root; n = n.parent) {
      if (n.lockRef === 0) {
        const tokens = n.key.length;
        this.evictableSize -= tokens;
        this.protectedSize += tokens;
        moved += tokens;
      }
      n.lockRef++;
    }
    return moved;
  }

  /** Releases a `lock(node)`. Returns how many tokens became evictable. */
  unlock(node: RadixNode): number {
    let moved = 0;
    for (let n: RadixNode | null = node; n !== null && n !== this.root; n = n.parent) {
      if (n.lockRef === 0) throw new Error(`radix cache: unlock of node ${n.id}, which no request holds`);
      if (--n.lockRef === 0) {
        const tokens = n.key.length;
        this.protectedSize -= tokens;
        this.evictableSize += tokens;
        moved += tokens;
        if (n.childCount === 0) this.pushHeap(n);
      }
    }
    return moved;
  }

  /** Refreshes the access stamp of `node` and its ancestors (a finished request's path, as sglang's insert does). */
  touchPath(node: RadixNode): void {
    const stamp = ++this.clock;
    for (let n: RadixNode | null = node; n !== null; n = n.parent) this.touch(n, stamp);
  }

  /**
   * Frees at least `tokens` tokens (or every evictable one) by removing unlocked leaves, least recently used
   * first; a parent left childless and unlocked becomes a leaf in turn. Returns the tokens freed.
   */
  evict(tokens: number): number {
    let freed = 0;
    while (freed < tokens) {
      const leaf = this.popLeastRecentLeaf();
      if (leaf === null) break;
      const length = leaf.key.length;
      this.pool.release(leaf.value, 0, length);
      freed += length;
      this.evictableSize -= length;
      const parent = leaf.parent!;
      this.removeChild(parent, leaf);
      leaf.evicted = true;
      this.nodeCount--;
      this.listener?.removed(leaf);
      if (parent !== this.root && parent.childCount === 0 && parent.lockRef === 0) this.pushHeap(parent);
    }
    return freed;
  }

  /** Empties the tree at once (sglang's reset); no request may hold any of it. No per-node events. */
  clear(): void {
    if (this.protectedSize > 0) throw new Error('radix cache: cleared while requests hold part of it');
    this.forEachNode((node) => {
      this.pool.release(node.value, 0, node.value.length);
      node.evicted = true;
    });
    this.root.onlyChild = null;
    this.root.children = null;
    this.root.childCount = 0;
    this.evictableSize = 0;
    this.nodeCount = 0;
    this.heapNodes = [];
    this.heapStamps = [];
  }

  /** Every node but the root, parents before children. */
  forEachNode(visit: (node: RadixNode) => void): void {
    const stack: RadixNode[] = [this.root];
    while (stack.length > 0) {
      const node = stack.pop()!;
      if (node !== this.root) visit(node);
      if (node.onlyChild !== null) stack.push(node.onlyChild);
      else if (node.children !== null) for (const child of node.children.values()) stack.push(child);
    }
  }

  private pageFloor(tokens: number): number {
    return tokens - (tokens % this.pageSize);
  }

  private childKeyAt(tokens: Uint32Array, pos: number): number {
    return this.pageSize === 1 ? tokens[pos] : contentHash(tokens, pos, pos + this.pageSize);
  }

  /** The child of `node` whose first page is `tokens[pos, pos + page)`, or null. */
  private findChild(node: RadixNode, tokens: Uint32Array, pos: number): RadixNode | null {
    if (node.childCount === 0) return null;
    const key = this.childKeyAt(tokens, pos);
    const child = node.onlyChild !== null ? (node.onlyChild.childKey === key ? node.onlyChild : null) : (node.children!.get(key) ?? null);
    if (child !== null && this.pageSize > 1) {
      const childKey = child.key;
      for (let i = 0; i < this.pageSize; i++) {
        // 53-bit hashes of pages under one parent colliding: never silently merge different tokens.
        if (childKey[i] !== tokens[pos + i]) throw new Error('radix cache: two different pages under one node share a content hash');
      }
    }
    return child;
  }

  /** Tokens of `tokens[pos, end)` that `child`'s key starts with, in whole pages. */
  private keyMatch(child: RadixNode, tokens: Uint32Array, pos: number, end: number): number {
    const key = child.key;
    const limit = Math.min(key.length, end - pos);
    let i = 0;
    while (i < limit && key[i] === tokens[pos + i]) i++;
    return this.pageFloor(i);
  }

  private touch(node: RadixNode, stamp: number): void {
    node.lastAccess = stamp;
    if (node.lockRef === 0 && node.childCount === 0 && node !== this.root) this.pushHeap(node);
  }

  /** Splits `child` after `at` tokens: a new node takes the head (and the child's place), `child` keeps the tail. */
  private split(child: RadixNode, at: number, stamp: number): RadixNode {
    const parent = child.parent!;
    const hashes = child.pageHashes;
    const headPages = at / this.pageSize;
    const head = new RadixNode(
      this.nextId++,
      parent,
      child.key.subarray(0, at),
      child.value.subarray(0, at),
      hashes === null ? null : hashes.slice(0, headPages),
      child.depth - child.key.length + at,
      stamp,
      child.childKey,
    );
    // Same requests hold both halves; the sizes do not change.
    head.lockRef = child.lockRef;
    if (parent.onlyChild === child) parent.onlyChild = head;
    else parent.children!.set(child.childKey, head);
    child.key = child.key.subarray(at);
    child.value = child.value.subarray(at);
    if (hashes !== null) child.pageHashes = hashes.slice(headPages);
    child.parent = head;
    child.childKey = this.childKeyAt(child.key, 0);
    head.onlyChild = child;
    head.childCount = 1;
    this.nodeCount++;
    return head;
  }

  private createLeaf(parent: RadixNode, tokens: Uint32Array, from: number, end: number, slots: Int32Array, stamp: number): RadixNode {
    // A view: a request's token ids never change once written, and the tree holds most of them anyway.
    const key = tokens.subarray(from, end);
    let hashes: number[] | null = null;
    if (this.hashPages) {
      hashes = new Array<number>(key.length / this.pageSize);
      let hash = parent.lastPageHash();
      for (let page = 0; page < hashes.length; page++) {
        hash = chainHash(hash, contentHash(key, page * this.pageSize, (page + 1) * this.pageSize));
        hashes[page] = hash;
      }
    }
    const leaf = new RadixNode(this.nextId++, parent, key, slots.subarray(from, end), hashes, end, stamp, this.childKeyAt(key, 0));
    this.addChild(parent, leaf);
    this.nodeCount++;
    this.evictableSize += key.length;
    this.pushHeap(leaf);
    this.listener?.stored(leaf);
    return leaf;
  }

  private addChild(parent: RadixNode, child: RadixNode): void {
    if (parent.childCount === 0) parent.onlyChild = child;
    else {
      if (parent.children === null) {
        const only = parent.onlyChild!;
        parent.children = new Map([[only.childKey, only]]);
        parent.onlyChild = null;
      }
      parent.children.set(child.childKey, child);
    }
    parent.childCount++;
  }

  private removeChild(parent: RadixNode, child: RadixNode): void {
    if (parent.onlyChild === child) parent.onlyChild = null;
    else {
      parent.children!.delete(child.childKey);
      if (parent.children!.size === 0) parent.children = null;
    }
    parent.childCount--;
  }

  private pushHeap(node: RadixNode): void {
    // Stale entries pile up as nodes are touched: rebuild from the live ones before they outgrow the tree.
    if (this.heapNodes.length > 2 * this.nodeCount + 1024) this.compactHeap();
    this.pushHeapEntry(node);
  }

  private heapLess(a: RadixNode, aStamp: number, b: RadixNode, bStamp: number): boolean {
    return aStamp < bStamp || (aStamp === bStamp && a.id < b.id);
  }

  private isLiveEntry(node: RadixNode, stamp: number): boolean {
    return !node.evicted && node.lockRef === 0 && node.childCount === 0 && node.lastAccess === stamp;
  }

  private popLeastRecentLeaf(): RadixNode | null {
    const nodes = this.heapNodes;
    const stamps = this.heapStamps;
    while (nodes.length > 0) {
      const node = nodes[0];
      const stamp = stamps[0];
      this.removeHeapTop();
      // A node pushed twice with one stamp (unlocked, locked, unlocked again) is evicted by the first copy.
      if (this.isLiveEntry(node, stamp)) return node;
    }
    return null;
  }

  private removeHeapTop(): void {
    const nodes = this.heapNodes;
    const stamps = this.heapStamps;
    const lastNode = nodes.pop()!;
    const lastStamp = stamps.pop()!;
    const size = nodes.length;
    if (size === 0) return;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= size) break;
      const right = left + 1;
      const smaller = right < size && this.heapLess(nodes[right], stamps[right], nodes[left], stamps[left]) ? right : left;
      if (!this.heapLess(nodes[smaller], stamps[smaller], lastNode, lastStamp)) break;
      nodes[i] = nodes[smaller];
      stamps[i] = stamps[smaller];
      i = smaller;
    }
    nodes[i] = lastNode;
    stamps[i] = lastStamp;
  }

  private compactHeap(): void {
    const live = new Set<RadixNode>();
    for (let i = 0; i < this.heapNodes.length; i++) if (this.isLiveEntry(this.heapNodes[i], this.heapStamps[i])) live.add(this.heapNodes[i]);
    this.heapNodes = [];
    this.heapStamps = [];
    for (const node of live) this.pushHeapEntry(node);
  }

  private pushHeapEntry(node: RadixNode): void {
    const nodes = this.heapNodes;
    const stamps = this.heapStamps;
    let i = nodes.length;
    nodes.push(node);
    stamps.push(node.lastAccess);
    while (i > 0) {
      const up = (i - 1) >> 1;
      if (!this.heapLess(node, node.lastAccess, nodes[up], stamps[up])) break;
      nodes[i] = nodes[up];
      stamps[i] = stamps[up];
      i = up;
    }
    nodes[i] = node;
    stamps[i] = node.lastAccess;
  }
}
