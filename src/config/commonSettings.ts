import { DEFAULT_REDACTED_HEADERS } from '../capture/forward.js';
import { API_KEY_SCOPES, DEFAULT_API_KEY_SCOPE } from '../wire/access.js';
import { choice, int, num, parsed, type Setting } from './settings.js';

/** Largest request body accepted unless told otherwise. */
export const DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024;
/** How long the upstream may stay silent (no response, no bytes) before the request fails. */
export const DEFAULT_UPSTREAM_TIMEOUT_MS = 600_000;
/** Seconds the requests in flight get to finish on SIGINT/SIGTERM. */
export const DEFAULT_SHUTDOWN_TIMEOUT_S = 30;
/** The capture file of `serve` and `capture` when none is named. */
export const DEFAULT_CAPTURES = 'captures/mocker.db';

/** A URL, refused with the flag's name. */
export function checkedUrl(flag: string, text: string): URL {
  try {
    return new URL(text);
  } catch {
    throw new Error(`${flag}: "${text}" is not a URL`);
  }
}

/** A URL flag's value: checked, kept as given. */
export const url = parsed((value, flag) => (checkedUrl(flag, value), value));

/** A TCP port (0: any free one). */
export const port = int({ min: 0, below: 65536 });

/** The settings every server has (serve, capture, pd-proxy), some with a default of their own per command. */
export const host: Setting = { flags: '--host <host>', help: 'address to listen on', group: 'server', default: '0.0.0.0', to: 'host' };
export const listenPort = (byDefault: number): Setting => ({
  flags: '--port <port>',
  help: 'port to listen on',
  group: 'server',
  value: port,
  default: byDefault,
  to: 'port',
});
export const maxBodyBytes: Setting = {
  flags: '--max-body-bytes <n>',
  help: 'largest request body accepted',
  group: 'server',
  value: int({ min: 1 }),
  default: DEFAULT_MAX_BODY_BYTES,
  to: 'maxBodyBytes',
};
export const shutdownTimeout: Setting = {
  flags: '--shutdown-timeout <s>',
  help: 'on SIGINT/SIGTERM, seconds the requests in flight get to finish before they are cut off (a second signal exits at once)',
  group: 'server',
  value: num({ min: 0 }),
  default: DEFAULT_SHUTDOWN_TIMEOUT_S,
};
export const captures = (group: Setting['group']): Setting => ({
  flags: '--captures <file>',
  help: 'capture file (SQLite)',
  group,
  default: DEFAULT_CAPTURES,
  to: 'captures',
});
export const upstreamCaCerts = (group: Setting['group']): Setting => ({
  flags: '--upstream-ca-certs <file>',
  help: "CA certificates (PEM) an https: upstream's certificate is checked against, instead of Node's",
  group,
  to: 'upstreamCaCerts',
});
export const upstreamTimeout = (group: Setting['group']): Setting => ({
  flags: '--upstream-timeout <ms>',
  help: 'upstream inactivity timeout',
  group,
  value: int({ min: 1 }),
  default: DEFAULT_UPSTREAM_TIMEOUT_MS,
  to: 'upstreamTimeoutMs',
});
export const redactHeader = (help: string, group: Setting['group']): Setting => ({
  flags: '--redact-header <name>',
  help,
  group,
  repeatable: true,
  default: [...DEFAULT_REDACTED_HEADERS],
  to: 'redactHeaders',
});
export const apiKeyScope = (to: string): Setting => ({
  flags: '--api-key-scope <scope>',
  help: 'what --api-key guards: v1 (/v1/*, as vLLM) | all (every route but health, version and metrics)',
  group: 'security',
  value: choice(API_KEY_SCOPES),
  default: DEFAULT_API_KEY_SCOPE,
  to,
});
/** vLLM's TLS flags (uvicorn's), the same on every server, listed after its own. */
export const tls: Setting[] = [
  { flags: '--ssl-keyfile <file>', help: 'serve HTTPS: the private key (PEM), with --ssl-certfile', group: 'security', to: 'tls.keyfile' },
  { flags: '--ssl-certfile <file>', help: 'serve HTTPS: the certificate chain (PEM), with --ssl-keyfile', group: 'security', to: 'tls.certfile' },
  {
    flags: '--ssl-ca-certs <file>',
    help: 'CA certificates (PEM) client certificates are checked against (with --ssl-cert-reqs)',
    group: 'security',
    to: 'tls.caCerts',
  },
  {
    flags: '--ssl-cert-reqs <n>',
    help: 'client certificates: 0 not asked, 1 optional (checked when sent), 2 required',
    group: 'security',
    value: int({ min: 0, max: 2 }),
    default: 0,
    to: 'tls.certReqs',
  },
];

/** A comma list of URLs, each checked. */
const urlList = parsed((value, flag) => value.split(',').map((u) => checkedUrl(flag, u.trim())));

/** `mocker capture`'s settings. */
export const CAPTURE_SETTINGS: Setting[] = [
  { flags: '--upstream <url>', help: 'the engine to capture (e.g. http://gpu-box:8000)', group: 'upstream', value: url, required: true, to: 'upstream' },
  upstreamCaCerts('upstream'),
  upstreamTimeout('upstream'),
  captures('recording'),
  {
    flags: '--model <model>',
    help: 'tokenizer stored with the capture: local directory or HF id in the local cache',
    group: 'recording',
    later: "the upstream's model if cached, else bundled",
    to: 'model',
  },
  { flags: '--label <text>', help: 'free text stored with this capture run', group: 'recording', to: 'label' },
  redactHeader('also never store this header (Authorization, API keys and cookies never are)', 'recording'),
  {
    flags: '--redact-bodies',
    help: 'store token ids and timing only: no text, request body or response bytes (replay renders from the ids)',
    group: 'recording',
    to: 'redactBodies',
  },
  host,
  listenPort(8001),
  {
    flags: '--threads <n>',
    help: "event loops forwarding the clients' streams: this process's and n - 1 forwarding processes', each dealt connections in turn (one port, one recorder)",
    group: 'server',
    value: int({ min: 1, max: 64 }),
    default: 1,
    to: 'threads',
  },
  maxBodyBytes,
  shutdownTimeout,
  {
    flags: '--api-key <key>',
    help: 'require Authorization: Bearer <key> on /v1/* (the header is passed on to the upstream)',
    group: 'security',
    to: 'access.key',
  },
  apiKeyScope('access.scope'),
  ...tls,
];

/** `mocker pd-proxy`'s settings. */
export const PD_PROXY_SETTINGS: Setting[] = [
  { flags: '--prefill <urls>', help: 'prefill engines, comma-separated (round robin)', group: 'engines', value: urlList, required: true, to: 'prefill' },
  { flags: '--decode <urls>', help: 'decode engines, comma-separated (round robin)', group: 'engines', value: urlList, required: true, to: 'decode' },
  host,
  listenPort(8000),
  maxBodyBytes,
  shutdownTimeout,
  {
    flags: '--api-key <key>',
    help: 'require Authorization: Bearer <key> on /v1/* (the header is passed on to the engines)',
    group: 'security',
    to: 'access.key',
  },
  apiKeyScope('access.scope'),
  ...tls,
];

/** `--force` of every command that writes a file (`-o`, `--report-json`, …): see util/outputFile.ts. */
export const FORCE = { flags: '--force', help: 'replace an existing output file (never a capture file, nor an input)' } as const;
