import type Database from 'better-sqlite3';
import { packVarints, unpackVarints } from './pack.js';

/** A node as the tree reads it: its edge's token ids, packed, and the newest complete capture below it. */
interface NodeRow {
  id: number;
  tokens: Buffer;
  newest: number;
}

export interface NearestNode {
  /** The newest complete capture among those sharing the longest prefix. */
  exchangeId: number;
  commonPrefix: number;
}

/** Length of the common prefix of `edge` and `ids` from position `from` of `ids`. */
function commonLength(edge: readonly number[], ids: ArrayLike<number>, from: number): number {
  const n = Math.min(edge.length, ids.length - from);
  let k = 0;
  while (k < n && edge[k] === ids[from + k]) k++;
  return k;
}

/**
 * The captured prompts of each model as a radix tree in the `prompt_nodes` table (schema.ts): a node is a
 * prefix, its edge the token ids from its parent's prefix to its own, and a node's children start with distinct
 * tokens. Every exchange with a model and prompt ids points at the node of its whole prompt (its only copy of the
 * ids), and each node knows the newest complete capture at or below it, so the longest shared prefix with any
 * request — and the newest capture sharing it — is one walk down, a few indexed reads whatever the file holds.
 */
export class PromptTree {
  private readonly selectRoot;
  private readonly insertRoot;
  private readonly selectChild;
  private readonly insertChild;
  private readonly detach;
  private readonly reattach;
  private readonly raiseNewest;
  private readonly zeroNewest;
  private readonly selectEdge;

  constructor(sqlite: Database.Database) {
    this.selectRoot = sqlite.prepare<[string], NodeRow>('select id, tokens, newest from prompt_nodes where model = ? and parent is null');
    this.insertRoot = sqlite.prepare<[string]>(`insert into prompt_nodes (model, tokens, newest) values (?, x'', 0)`);
    this.selectChild = sqlite.prepare<[number, number], NodeRow>('select id, tokens, newest from prompt_nodes where parent = ? and first_token = ?');
    this.insertChild = sqlite.prepare<[number, number, Buffer, number]>('insert into prompt_nodes (parent, first_token, tokens, newest) values (?, ?, ?, ?)');
    this.detach = sqlite.prepare<[number]>('update prompt_nodes set parent = null, first_token = null where id = ?');
    this.reattach = sqlite.prepare<[number, number, Buffer, number]>('update prompt_nodes set parent = ?, first_token = ?, tokens = ? where id = ?');
    this.raiseNewest = sqlite.prepare<[number, number]>('update prompt_nodes set newest = max(newest, ?) where id = ?');
    this.zeroNewest = sqlite.prepare('update prompt_nodes set newest = 0');
    this.selectEdge = sqlite.prepare<[number], { parent: number | null; tokens: Buffer }>('select parent, tokens from prompt_nodes where id = ?');
  }

  /**
   * Adds a prompt (in the caller's transaction): returns the node of the whole prompt, and the path to it from the
   * root for `raise`.
   */
  place(model: string, ids: ArrayLike<number>): { node: number; path: number[] } {
    let node = this.selectRoot.get(model)?.id ?? Number(this.insertRoot.run(model).lastInsertRowid);
    const path = [node];
    let depth = 0;
    while (depth < ids.length) {
      const child = this.selectChild.get(node, ids[depth]);
      if (!child) {
        node = Number(this.insertChild.run(node, ids[depth], packVarints(Array.prototype.slice.call(ids, depth) as number[]), 0).lastInsertRowid);
        path.push(node);
        break;
      }
      const edge = unpackVarints(child.tokens);
      const shared = commonLength(edge, ids, depth);
      if (shared < edge.length) {
        // Split the edge at the divergence: a new node for the shared part takes the child's place (the child keeps
        // its id, which exchanges point at) and the child hangs below it with the rest of its edge.
        this.detach.run(child.id);
        const middle = Number(this.insertChild.run(node, edge[0], packVarints(edge.slice(0, shared)), child.newest).lastInsertRowid);
        this.reattach.run(middle, edge[shared], packVarints(edge.slice(shared)), child.id);
        node = middle;
      } else node = child.id;
      path.push(node);
      depth += shared;
    }
    return { node, path };
  }

  /** Makes complete exchange `exchangeId`, whose prompt `place` gave `path`, a candidate for `nearest`. */
  raise(path: readonly number[], exchangeId: number): void {
    for (const id of path) this.raiseNewest.run(exchangeId, id);
  }

  /** Forgets every node's newest capture (exchanges were deleted): the caller raises those that are left again. */
  clearNewest(): void {
    this.zeroNewest.run();
  }

  /** The complete capture of `model` sharing the longest prefix with `ids` (ties: the newest), or null if it has none. */
  nearest(model: string, ids: ArrayLike<number>): NearestNode | null {
    const root = this.selectRoot.get(model);
    if (!root || root.newest === 0) return null;
    let node = root;
    let depth = 0;
    while (depth < ids.length) {
      const child = this.selectChild.get(node.id, ids[depth]);
      // Below `node`, no complete capture continues with the request's next token: all of them share `depth`.
      if (!child || child.newest === 0) break;
      const edge = unpackVarints(child.tokens);
      const shared = commonLength(edge, ids, depth);
      // Diverged inside the edge: every capture below the child shares exactly this much, the others less.
      if (shared < edge.length) return { exchangeId: child.newest, commonPrefix: depth + shared };
      node = child;
      depth += shared;
    }
    return { exchangeId: node.newest, commonPrefix: depth };
  }

  /** The token ids of the prompt ending at `node`. */
  prompt(node: number): number[] {
    const edges: Buffer[] = [];
    for (let at: number | null = node; at !== null; ) {
      const row = this.selectEdge.get(at);
      if (!row) throw new Error(`prompt node ${at} is missing`);
      edges.push(row.tokens);
      at = row.parent;
    }
    const ids: number[] = [];
    for (let i = edges.length - 1; i >= 0; i--) for (const id of unpackVarints(edges[i])) ids.push(id);
    return ids;
  }
}
