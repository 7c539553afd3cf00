export { DecodeStream } from './decodeStream.js';
export {
  BUNDLED_MODEL,
  findInHfCache,
  loadModelFiles,
  loadTokenizer,
  ModelNotFoundError,
  ModelTokenizer,
  TOKENIZER_FILES,
  TooManyTokens,
  type ChatTemplateRequest,
} from './tokenizer.js';
