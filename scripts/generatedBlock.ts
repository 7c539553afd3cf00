/**
 * A generated block of a Markdown file (the benchmark tables, the CLI reference): the text between two marker
 * comments, rewritten by its generator while the hand-written text around it stays.
 */
export interface GeneratedBlock {
  begin: string;
  end: string;
}

/** `text` with what lies between the block's two markers replaced by `section`. */
export function replaceBetweenMarkers(text: string, block: GeneratedBlock, section: string): string {
  const begin = text.indexOf(block.begin);
  const end = text.indexOf(block.end);
  if (begin < 0 || end < begin) throw new Error(`no "${block.begin}" … "${block.end}" markers`);
  return `${text.slice(0, begin + block.begin.length)}\n${section}\n${text.slice(end)}`;
}
