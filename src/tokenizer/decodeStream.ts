const REPLACEMENT = '\uFFFD';

/**
 * Port of Hugging Face `tokenizers.decoders.DecodeStream`, the incremental detokenizer of vLLM V1:
 * each step returns the new text, or null while the text ends in an incomplete UTF-8 sequence.
 * Steps must be awaited one after the other.
 */
export class DecodeStream {
  private ids: number[] = [];
  private prefix = '';
  private prefixIndex = 0;

  constructor(private readonly decode: (ids: number[]) => Promise<string>) {}

  async step(id: number): Promise<string | null> {
    this.ids.push(id);
    const text = await this.decode(this.ids);
    if (text.length <= this.prefix.length || text.endsWith(REPLACEMENT)) return null;
    if (!text.startsWith(this.prefix)) throw new Error('DecodeStream: decoded text no longer starts with its prefix');
    const piece = text.slice(this.prefix.length);
    const newPrefixIndex = this.ids.length - this.prefixIndex;
    this.ids = this.ids.slice(this.prefixIndex);
    this.prefix = await this.decode(this.ids);
    this.prefixIndex = newPrefixIndex;
    return piece;
  }
}
