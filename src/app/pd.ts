import { DEFAULT_MAX_BODY_BYTES } from '../config/commonSettings.js';
import { listeningServer } from '../wire/drain.js';
import { serverTls } from '../wire/tls.js';
import { startPdProxy } from '../pd/proxy.js';
import { IN_PROCESS_ADDRESS, advertisedHost, apiKeyPolicy, startServe, type Running } from './serve.js';
import type { ServeOptions } from '../config/serveOptions.js';
import { totalRecorded } from './shutdown.js';

/** `--pd xPyD`: how many prefill and decode engines. */
export function parsePdLayout(text: string): { prefill: number; decode: number } {
  const match = /^(\d+)P(\d+)D$/i.exec(text.trim());
  if (!match || Number(match[1]) < 1 || Number(match[2]) < 1) throw new Error(`--pd must look like 1P1D or 2P3D (x prefill, y decode engines), got "${text}"`);
  return { prefill: Number(match[1]), decode: Number(match[2]) };
}

/**
 * `mocker serve --pd xPyD`: x prefill and y decode engines in this process, each on its own loopback port,
 * behind the same proxy as `mocker pd-proxy` on the serve port: a PD deployment in one command.
 */
export async function startPdDeployment(options: ServeOptions, layout: { prefill: number; decode: number }): Promise<Running> {
  // The proxy's port first: a taken one fails before any engine opens (or records into) a capture file.
  const host = options.host ?? IN_PROCESS_ADDRESS.host;
  const port = options.port ?? IN_PROCESS_ADDRESS.port;
  const tls = serverTls(options.tls);
  const { drain, server } = await listeningServer(host, port, tls);
  const engines: Running[] = [];
  // The decode engines pull from the deployment's own prefill engines, and from nowhere else.
  const prefillPeers: string[] = [];
  const start = async (role: 'prefill' | 'decode', roleIndex: number) => {
    // Engine i publishes its KV events on the config's ports offset by i × DP size, as worker i would.
    // Behind the proxy on loopback: TLS is the proxy's.
    const running = await startServe({
      ...options,
      tls: undefined,
      role,
      roleIndex,
      host: '127.0.0.1',
      port: 0,
      numWorkers: 1,
      engineIndex: engines.length,
      kvTransferAllowedHosts: role === 'decode' ? prefillPeers : [],
    });
    engines.push(running);
    return new URL(`http://127.0.0.1:${running.port}`);
  };
  try {
    const prefill: URL[] = [];
    const decode: URL[] = [];
    for (let i = 0; i < layout.prefill; i++) {
      const url = await start('prefill', i);
      prefill.push(url);
      prefillPeers.push(`${advertisedHost('127.0.0.1')}:${url.port}`);
    }
    for (let i = 0; i < layout.decode; i++) decode.push(await start('decode', i));
    const proxy = await startPdProxy({
      prefill,
      decode,
      host,
      port,
      maxBodyBytes: options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
      access: apiKeyPolicy(options),
      listening: { drain, server },
    });
    return {
      port: proxy.port,
      ports: engines.map((e) => e.port),
      close: async (graceMs = 0) => {
        // Clients talk to the proxy: its drain is the deployment's; the engines then only had its requests.
        const drained = await proxy.close(graceMs);
        const stopped = await Promise.all(engines.map((e) => e.close()));
        return { ...drained, recorded: totalRecorded(stopped) };
      },
    };
  } catch (err) {
    await drain.drain(0);
    await Promise.all(engines.map((e) => e.close()));
    throw err;
  }
}
