export { DecodeStream } from './decodeStream.js';
export {
  BUNDLED_MODEL,
  findInHfCache,
  loadModelFiles,
  loadTokenizer,
  ModelNotFoundError,
  ModelTokenizer,
  TOKENIZER_FILES,
  type ChatTemplateRequest,
} from './tokenizer.js';
