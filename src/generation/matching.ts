/** How served requests find their captures, apart from the resolver: the settings name its defaults without loading it. */

/** `serve --match`: which captures answer a prompt (docs/serve.md, "Matching modes"). */
export type MatchMode = 'exact' | 'prefix' | 'sequence';
/** `--min-prefix-ratio`'s default: a prefix hit shares at least 80 % of the request's prompt. */
export const DEFAULT_MIN_PREFIX_RATIO = 0.8;
