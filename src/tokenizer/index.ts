export { ChatMessageError } from './chatMessages.js';
export { ChunkVocabulary } from './chunkTokenizer.js';
export { DecodeStream } from './decodeStream.js';
export {
  BUNDLED_MODEL,
  carriesChatTemplate,
  findInHfCache,
  loadModelFiles,
  loadTokenizer,
  maxModelLenOf,
  ModelNotFoundError,
  ModelTokenizer,
  SANDBOXED_TEMPLATE_TIMEOUT_MS,
  TOKENIZER_FILES,
  TooManyTokens,
  type ChatTemplateRequest,
} from './tokenizer.js';
