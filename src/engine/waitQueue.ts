interface Node<T> {
  value: T;
  prev: Node<T> | null;
  next: Node<T> | null;
}

/** A FIFO with O(1) push at both ends and O(1) removal of any entry (the scheduler's waiting queue). */
export class WaitQueue<T> {
  private head: Node<T> | null = null;
  private tail: Node<T> | null = null;
  private readonly nodes = new Map<T, Node<T>>();

  get size(): number {
    return this.nodes.size;
  }

  front(): T | undefined {
    return this.head?.value;
  }

  pushBack(value: T): void {
    const node: Node<T> = { value, prev: this.tail, next: null };
    if (this.tail) this.tail.next = node;
    else this.head = node;
    this.tail = node;
    this.nodes.set(value, node);
  }

  pushFront(value: T): void {
    const node: Node<T> = { value, prev: null, next: this.head };
    if (this.head) this.head.prev = node;
    else this.tail = node;
    this.head = node;
    this.nodes.set(value, node);
  }

  remove(value: T): boolean {
    const node = this.nodes.get(value);
    if (!node) return false;
    if (node.prev) node.prev.next = node.next;
    else this.head = node.next;
    if (node.next) node.next.prev = node.prev;
    else this.tail = node.prev;
    this.nodes.delete(value);
    return true;
  }

  *[Symbol.iterator](): IterableIterator<T> {
    for (let node = this.head; node; node = node.next) yield node.value;
  }
}
