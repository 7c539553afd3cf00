import { readFileSync } from 'node:fs';
import type { ServerOptions } from 'node:https';
import { createSecureContext } from 'node:tls';

/** vLLM's (uvicorn's) TLS flags, the same on every server: `--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`, `--ssl-cert-reqs`. */
export interface TlsFiles {
  keyfile?: string;
  certfile?: string;
  /** CA certificates that client certificates are checked against. */
  caCerts?: string;
  /** Python's `ssl.VerifyMode`, as vLLM takes it: 0 no client certificate asked, 1 optional (checked when sent), 2 required. Default 0. */
  certReqs?: number;
}

export const CERT_REQS = [0, 1, 2] as const;

/** A server's TLS: Node's options, and whether a client certificate that is sent must check out (`--ssl-cert-reqs 1`). */
export interface ServerTls {
  options: ServerOptions;
  optionalClientCert: boolean;
}

/** A PEM file's bytes; an error naming the flag and the file. */
function readPem(flag: string, path: string): Buffer {
  try {
    return readFileSync(path);
  } catch (err) {
    throw new Error(`${flag} ${path}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message}`);
  }
}

/** The server's TLS from its flags, checked now (a key that does not match its certificate fails the start); undefined: plain HTTP. */
export function serverTls(files: TlsFiles = {}): ServerTls | undefined {
  const certReqs = files.certReqs ?? 0;
  if (!(CERT_REQS as readonly number[]).includes(certReqs)) throw new Error(`--ssl-cert-reqs must be 0, 1 or 2, got ${certReqs}`);
  if (files.keyfile === undefined && files.certfile === undefined) {
    if (files.caCerts !== undefined || certReqs !== 0) throw new Error('--ssl-ca-certs and --ssl-cert-reqs need --ssl-keyfile and --ssl-certfile');
    return undefined;
  }
  if (files.keyfile === undefined || files.certfile === undefined) throw new Error('--ssl-keyfile and --ssl-certfile go together: give both');
  const options: ServerOptions = {
    key: readPem('--ssl-keyfile', files.keyfile),
    cert: readPem('--ssl-certfile', files.certfile),
    ...(files.caCerts !== undefined ? { ca: readPem('--ssl-ca-certs', files.caCerts) } : {}),
    requestCert: certReqs > 0,
    rejectUnauthorized: certReqs === 2,
  };
  try {
    createSecureContext(options);
  } catch (err) {
    throw new Error(
      `--ssl-keyfile ${files.keyfile} / --ssl-certfile ${files.certfile}${files.caCerts ? ` / --ssl-ca-certs ${files.caCerts}` : ''}: ${(err as Error).message}`,
    );
  }
  return { options, optionalClientCert: certReqs === 1 };
}

/** How to trust an https: upstream: `ca` (PEM, `--upstream-ca-certs`) in place of Node's CA list; verification is never off. */
export interface UpstreamTls {
  ca?: string;
}

/** `--upstream-ca-certs`: the CAs an https: upstream's certificate is checked against, instead of Node's. */
export function upstreamTls(caFile: string | undefined): UpstreamTls {
  return caFile === undefined ? {} : { ca: readPem('--upstream-ca-certs', caFile).toString('utf8') };
}
