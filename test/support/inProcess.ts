/**
 * The in-process harness: `serve`, the capture proxy, the PD proxy and a `serve --pd` deployment started in the
 * test's own process on a free loopback port. The test closes what it starts (`close()`, as the CLI's SIGTERM
 * would). The only place tests import the composition roots from, so a move of those changes these lines alone.
 */
import { startCapture, type CaptureOptions } from '../../src/app/capture.js';
import { startPdDeployment } from '../../src/app/pd.js';
import { startServe, type Running, type ServeOptions } from '../../src/app/serve.js';
import { startPdProxy, type PdProxyOptions, type RunningProxy } from '../../src/pd/proxy.js';

export type { Running, RunningProxy, ServeOptions };

/** A server started in this process, with the URL it answers on (its first engine's, with `numWorkers`). */
export type InProcess<R extends { port: number }> = R & { url: string };

const onLoopback = <R extends { port: number }>(running: R): InProcess<R> => Object.assign(running, { url: `http://127.0.0.1:${running.port}` });

/** `serve` with `options` (`startServe`'s defaults otherwise: 127.0.0.1, a free port). */
export async function serveInProcess(options: ServeOptions): Promise<InProcess<Running>> {
  return onLoopback(await startServe(options));
}

/** `capture` of `upstream` into `captures`, with test-sized limits unless given: 10 s upstream timeout, 1 MiB bodies, no header redacted. */
export async function captureInProcess(options: Pick<CaptureOptions, 'upstream' | 'captures'> & Partial<CaptureOptions>): Promise<InProcess<Running>> {
  return onLoopback(await startCapture({ host: '127.0.0.1', port: 0, upstreamTimeoutMs: 10_000, maxBodyBytes: 1 << 20, redactHeaders: [], ...options }));
}

/** `pd-proxy` in front of the prefill and decode engines at these URLs (1 MiB bodies unless given). */
export async function pdProxyInProcess(
  options: { prefill: string[]; decode: string[] } & Partial<Omit<PdProxyOptions, 'prefill' | 'decode'>>,
): Promise<InProcess<RunningProxy>> {
  const { prefill, decode, ...rest } = options;
  const toUrls = (urls: string[]) => urls.map((u) => new URL(u));
  return onLoopback(await startPdProxy({ host: '127.0.0.1', port: 0, maxBodyBytes: 1 << 20, ...rest, prefill: toUrls(prefill), decode: toUrls(decode) }));
}

/** `serve --pd <prefill>P<decode>D`: the engines and the proxy in front of them (on `options.port`). */
export async function pdDeploymentInProcess(options: ServeOptions, layout: { prefill: number; decode: number }): Promise<InProcess<Running>> {
  return onLoopback(await startPdDeployment(options, layout));
}
