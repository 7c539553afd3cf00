import { STATUS_CODES } from 'node:http';

/** An error the API reports in vLLM's format (`{"error":{message,type,param,code}}`, vLLM ≥ 0.10.1). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type: string = defaultType(status),
    readonly param: string | null = null,
  ) {
    super(message);
  }

  body(): string {
    return errorJson(this.status, this.message, this.type, this.param);
  }

  /** The in-stream form: Python's `json.dumps` separators, after the 200 has gone out. */
  streamEvent(): string {
    const inner = { message: this.message, type: this.type, param: this.param, code: this.status };
    return `data: ${pythonJsonDumps({ error: inner })}\n\n`;
  }
}

function defaultType(status: number): string {
  if (status === 400) return 'BadRequestError';
  if (status === 404) return 'NotFoundError';
  if (status === 500) return 'InternalServerError';
  if (status === 501) return 'NotImplementedError';
  return STATUS_CODES[status] ?? 'Error';
}

export function errorJson(status: number, message: string, type = defaultType(status), param: string | null = null): string {
  return JSON.stringify({ error: { message, type, param, code: status } });
}

export const badRequest = (message: string, param: string | null = null) => new ApiError(400, message, 'BadRequestError', param);
export const modelNotFound = (model: string) => new ApiError(404, `The model \`${model}\` does not exist.`, 'NotFoundError', 'model');

/**
 * `json.dumps` with its default separators (", " and ": "), for the error events vLLM writes mid-stream; `ensureAscii`:
 * also its default escaping of non-ASCII characters as \uXXXX (the tool call arguments vLLM templates for a Messages tool_use).
 */
export function pythonJsonDumps(value: unknown, ensureAscii = false): string {
  if (value === null || typeof value !== 'object') {
    const json = JSON.stringify(value) ?? 'null';
    return ensureAscii ? json.replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`) : json;
  }
  if (Array.isArray(value)) return `[${value.map((v) => pythonJsonDumps(v, ensureAscii)).join(', ')}]`;
  const entries = Object.entries(value as Record<string, unknown>).map(([k, v]) => `${pythonJsonDumps(k, ensureAscii)}: ${pythonJsonDumps(v, ensureAscii)}`);
  return `{${entries.join(', ')}}`;
}
