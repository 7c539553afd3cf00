import type { EngineObserver, PassStats } from '../engine/index.js';
import { seededUniform } from '../util/mulberry32.js';

/** A GPU model as nvidia-smi names it, with what its data sheet gives and what it does at idle and full load. */
interface GpuSpec {
  modelName: string;
  memoryMiB: number;
  /** Board power limit (TDP), W. */
  maxPowerW: number;
  idlePowerW: number;
  idleSmClockMHz: number;
  /** Max boost clock. */
  maxSmClockMHz: number;
  memClockMHz: number;
  idleTempC: number;
  maxTempC: number;
}

/**
 * Memory and power limits from NVIDIA's data sheets (HGX/DGX per-GPU figures for the SXM parts), boost and memory
 * clocks as nvidia-smi reports them; idle power, idle clock and temperatures are typical readings (AIPerf's mock
 * server uses the same ones).
 */
export const DCGM_GPUS = {
  rtx6000: {
    modelName: 'NVIDIA RTX 6000 Ada Generation',
    memoryMiB: 48 * 1024,
    maxPowerW: 300,
    idlePowerW: 30,
    idleSmClockMHz: 915,
    maxSmClockMHz: 2505,
    memClockMHz: 10001,
    idleTempC: 35,
    maxTempC: 83,
  },
  a100: {
    modelName: 'NVIDIA A100-SXM4-40GB',
    memoryMiB: 40 * 1024,
    maxPowerW: 400,
    idlePowerW: 50,
    idleSmClockMHz: 765,
    maxSmClockMHz: 1410,
    memClockMHz: 1215,
    idleTempC: 40,
    maxTempC: 85,
  },
  h100: {
    modelName: 'NVIDIA H100 PCIe',
    memoryMiB: 80 * 1024,
    maxPowerW: 350,
    idlePowerW: 40,
    idleSmClockMHz: 1095,
    maxSmClockMHz: 1755,
    memClockMHz: 1593,
    idleTempC: 35,
    maxTempC: 82,
  },
  'h100-sxm': {
    modelName: 'NVIDIA H100 80GB HBM3',
    memoryMiB: 80 * 1024,
    maxPowerW: 700,
    idlePowerW: 70,
    idleSmClockMHz: 1350,
    maxSmClockMHz: 1980,
    memClockMHz: 2619,
    idleTempC: 40,
    maxTempC: 88,
  },
  h200: {
    modelName: 'NVIDIA H200',
    memoryMiB: 141 * 1024,
    maxPowerW: 700,
    idlePowerW: 70,
    idleSmClockMHz: 1350,
    maxSmClockMHz: 1980,
    memClockMHz: 3201,
    idleTempC: 40,
    maxTempC: 88,
  },
  b200: {
    modelName: 'NVIDIA B200',
    memoryMiB: 180 * 1024,
    maxPowerW: 1000,
    idlePowerW: 100,
    idleSmClockMHz: 1500,
    maxSmClockMHz: 1965,
    memClockMHz: 3996,
    idleTempC: 40,
    maxTempC: 90,
  },
  gb200: {
    modelName: 'NVIDIA GB200',
    memoryMiB: 186 * 1024,
    maxPowerW: 1200,
    idlePowerW: 100,
    idleSmClockMHz: 1500,
    maxSmClockMHz: 2062,
    memClockMHz: 3996,
    idleTempC: 40,
    maxTempC: 90,
  },
} satisfies Record<string, GpuSpec>;

export type DcgmGpuName = keyof typeof DCGM_GPUS;
export const DCGM_GPU_NAMES = Object.keys(DCGM_GPUS) as DcgmGpuName[];

export interface DcgmConfig {
  gpuName: DcgmGpuName;
  numGpus: number;
  /** Load follows token throughput (else the GPUs stay idle). */
  autoLoad: boolean;
  /** Tokens/s taken as full load until more is seen. */
  minThroughput: number;
  windowSec: number;
  hostname: string;
  /** Seed of the noise and the UUIDs: the second exporter uses seed + 1. */
  seed: number;
}

/** AIPerf's mock server's defaults (`--dcgm-*`); without a seed, each start draws one. */
export const DEFAULT_DCGM: Omit<DcgmConfig, 'seed'> = { gpuName: 'h200', numGpus: 2, autoLoad: true, minThroughput: 100, windowSec: 1, hostname: 'localhost' };

/** vLLM's default --gpu-memory-utilization: the framebuffer it takes at start-up, whatever the load. */
const MEMORY_UTILIZATION = 0.9;

/**
 * AIPerf's mock server's auto-scaling rule: throughput is the tokens of the last `window` over the window, the peak the
 * largest throughput seen (at least `minThroughput`), the load their ratio.
 */
class ThroughputLoad {
  /** Recorded passes, oldest first from `head` (a queue: shifting an array thousands of entries long per pass costs more than the pass). */
  private readonly events: { atMs: number; tokens: number }[] = [];
  private head = 0;
  private tokens = 0;
  private peak: number;

  constructor(
    private readonly windowMs: number,
    minThroughput: number,
  ) {
    this.peak = minThroughput;
  }

  record(tokens: number, nowMs: number): void {
    this.events.push({ atMs: nowMs, tokens });
    this.tokens += tokens;
    this.peak = Math.max(this.peak, this.throughput(nowMs));
  }

  load(nowMs: number): number {
    return Math.min(1, this.throughput(nowMs) / this.peak);
  }

  private throughput(nowMs: number): number {
    const events = this.events;
    while (this.head < events.length && events[this.head].atMs <= nowMs - this.windowMs) this.tokens -= events[this.head++].tokens;
    if (this.head > 1024 && this.head * 2 > events.length) {
      events.splice(0, this.head);
      this.head = 0;
    }
    return this.tokens / (this.windowMs / 1000);
  }
}

interface DcgmField {
  name: string;
  type: 'gauge' | 'counter';
  help: string;
  /** DCGM's double fields print as Go's %f, its integer fields as integers. */
  float?: boolean;
}

/**
 * dcgm-exporter's default counters (etc/default-counters.csv), its DCP fields (etc/dcp-metrics-included.csv) and
 * the fields AIPerf's GPU telemetry reads besides (FB total, power limit, throttling).
 */
const FIELDS = [
  { name: 'DCGM_FI_DEV_SM_CLOCK', type: 'gauge', help: 'SM clock frequency (in MHz).' },
  { name: 'DCGM_FI_DEV_MEM_CLOCK', type: 'gauge', help: 'Memory clock frequency (in MHz).' },
  { name: 'DCGM_FI_DEV_MEMORY_TEMP', type: 'gauge', help: 'Memory temperature (in C).' },
  { name: 'DCGM_FI_DEV_GPU_TEMP', type: 'gauge', help: 'GPU temperature (in C).' },
  { name: 'DCGM_FI_DEV_POWER_USAGE', type: 'gauge', help: 'Power draw (in W).', float: true },
  { name: 'DCGM_FI_DEV_POWER_MGMT_LIMIT', type: 'gauge', help: 'Power management limit (in W).', float: true },
  { name: 'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION', type: 'counter', help: 'Total energy consumption since boot (in mJ).' },
  { name: 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER', type: 'counter', help: 'Total number of PCIe retries.' },
  { name: 'DCGM_FI_DEV_GPU_UTIL', type: 'gauge', help: 'GPU utilization (in %).' },
  { name: 'DCGM_FI_DEV_MEM_COPY_UTIL', type: 'gauge', help: 'Memory utilization (in %).' },
  { name: 'DCGM_FI_DEV_ENC_UTIL', type: 'gauge', help: 'Encoder utilization (in %).' },
  { name: 'DCGM_FI_DEV_DEC_UTIL', type: 'gauge', help: 'Decoder utilization (in %).' },
  { name: 'DCGM_FI_DEV_XID_ERRORS', type: 'gauge', help: 'Value of the last XID error encountered.' },
  { name: 'DCGM_FI_DEV_POWER_VIOLATION', type: 'counter', help: 'Throttling duration due to power constraints (in us).' },
  { name: 'DCGM_FI_DEV_THERMAL_VIOLATION', type: 'counter', help: 'Throttling duration due to thermal constraints (in us).' },
  { name: 'DCGM_FI_DEV_FB_FREE', type: 'gauge', help: 'Framebuffer memory free (in MiB).' },
  { name: 'DCGM_FI_DEV_FB_USED', type: 'gauge', help: 'Framebuffer memory used (in MiB).' },
  { name: 'DCGM_FI_DEV_FB_TOTAL', type: 'gauge', help: 'Framebuffer memory total (in MiB).' },
  { name: 'DCGM_FI_PROF_GR_ENGINE_ACTIVE', type: 'gauge', help: 'Ratio of time the graphics engine is active.', float: true },
  { name: 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE', type: 'gauge', help: 'Ratio of cycles the tensor (HMMA) pipe is active.', float: true },
  { name: 'DCGM_FI_PROF_DRAM_ACTIVE', type: 'gauge', help: 'Ratio of cycles the device memory interface is active sending or receiving data.', float: true },
] as const satisfies readonly DcgmField[];

type Sample = Record<(typeof FIELDS)[number]['name'], number>;

/** One simulated GPU: its identity and what it has accumulated since "boot". */
interface SimulatedGpu {
  labels: string;
  energyMj: number;
  powerViolationUs: number;
  thermalViolationUs: number;
}

/** One dcgm-exporter instance on a node of `numGpus` GPUs. */
class DcgmExporter {
  private readonly random: () => number;
  private readonly gpus: SimulatedGpu[];
  private lastScrapeMs: number | null = null;

  constructor(
    private readonly spec: GpuSpec,
    numGpus: number,
    hostname: string,
    seed: number,
  ) {
    this.random = seededUniform(seed);
    const hex = (digits: number) => Array.from({ length: digits }, () => Math.floor(this.random() * 16).toString(16)).join('');
    this.gpus = Array.from({ length: numGpus }, (_, gpu) => {
      const uuid = `GPU-${hex(8)}-${hex(4)}-${hex(4)}-${hex(4)}-${hex(12)}`;
      const pciBusId = `00000000:${(gpu + 0x18).toString(16).toUpperCase().padStart(2, '0')}:00.0`;
      return {
        labels: `gpu="${gpu}",UUID="${uuid}",pci_bus_id="${pciBusId}",device="nvidia${gpu}",modelName="${spec.modelName}",Hostname="${hostname}"`,
        energyMj: 0,
        powerViolationUs: 0,
        thermalViolationUs: 0,
      };
    });
  }

  /** A scrape at `nowMs` under `load` (0 idle, 1 full): each GPU's readings, with a little seeded noise. */
  text(load: number, nowMs: number): string {
    const elapsedS = this.lastScrapeMs === null ? 0 : (nowMs - this.lastScrapeMs) / 1000;
    this.lastScrapeMs = nowMs;
    const s = this.spec;
    // Multiplicative noise: an idle reading of 0 stays 0.
    const noisy = (value: number, variance: number, max: number) => Math.max(0, Math.min(max, value * (1 - variance + 2 * variance * this.random())));
    const between = (idle: number, max: number) => idle + load * (max - idle);
    const samples: Sample[] = this.gpus.map((gpu) => {
      const power = noisy(between(s.idlePowerW, s.maxPowerW), 0.02, s.maxPowerW);
      const temp = noisy(between(s.idleTempC, s.maxTempC), 0.01, s.maxTempC);
      gpu.energyMj += power * elapsedS * 1000;
      // Throttled since the last scrape when within 5 % of the power limit or 5 °C of the maximum temperature.
      if (power > 0.95 * s.maxPowerW) gpu.powerViolationUs += elapsedS * 1e6;
      if (temp > s.maxTempC - 5) gpu.thermalViolationUs += elapsedS * 1e6;
      const used = Math.round(s.memoryMiB * MEMORY_UTILIZATION);
      const util = noisy(load * 100, 0.03, 100);
      return {
        DCGM_FI_DEV_SM_CLOCK: Math.round(noisy(between(s.idleSmClockMHz, s.maxSmClockMHz), 0.01, s.maxSmClockMHz)),
        DCGM_FI_DEV_MEM_CLOCK: s.memClockMHz,
        DCGM_FI_DEV_MEMORY_TEMP: Math.round(temp + 3 + 5 * this.random()),
        DCGM_FI_DEV_GPU_TEMP: Math.round(temp),
        DCGM_FI_DEV_POWER_USAGE: power,
        DCGM_FI_DEV_POWER_MGMT_LIMIT: s.maxPowerW,
        DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: Math.round(gpu.energyMj),
        DCGM_FI_DEV_PCIE_REPLAY_COUNTER: 0,
        DCGM_FI_DEV_GPU_UTIL: Math.round(util),
        DCGM_FI_DEV_MEM_COPY_UTIL: Math.round(noisy(load * 50, 0.05, 100)),
        DCGM_FI_DEV_ENC_UTIL: 0,
        DCGM_FI_DEV_DEC_UTIL: 0,
        DCGM_FI_DEV_XID_ERRORS: 0,
        DCGM_FI_DEV_POWER_VIOLATION: Math.round(gpu.powerViolationUs),
        DCGM_FI_DEV_THERMAL_VIOLATION: Math.round(gpu.thermalViolationUs),
        DCGM_FI_DEV_FB_FREE: s.memoryMiB - used,
        DCGM_FI_DEV_FB_USED: used,
        DCGM_FI_DEV_FB_TOTAL: s.memoryMiB,
        DCGM_FI_PROF_GR_ENGINE_ACTIVE: util / 100,
        DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: noisy(load * 0.6, 0.05, 1),
        DCGM_FI_PROF_DRAM_ACTIVE: noisy(load * 0.5, 0.05, 1),
      };
    });
    const lines: string[] = [];
    for (const field of FIELDS) {
      lines.push(`# HELP ${field.name} ${field.help}`, `# TYPE ${field.name} ${field.type}`);
      const format = (v: number) => ('float' in field ? v.toFixed(6) : String(v));
      this.gpus.forEach((gpu, i) => lines.push(`${field.name}{${gpu.labels}} ${format(samples[i][field.name])}`));
    }
    return `${lines.join('\n')}\n`;
  }
}

/**
 * Simulated DCGM telemetry for `/dcgm1/metrics` and `/dcgm2/metrics` (AIPerf's mock server): two dcgm-exporter instances whose
 * GPUs' utilisation, power, temperature and SM clock go from the GPU model's idle to its maximum with the load, the
 * load following the engine's generated tokens. The clock is read when tokens are recorded and when a scrape reads.
 */
export class DcgmTelemetry implements EngineObserver {
  private readonly throughput: ThroughputLoad;
  private readonly exporters: DcgmExporter[];

  constructor(private readonly config: DcgmConfig) {
    this.throughput = new ThroughputLoad(config.windowSec * 1000, config.minThroughput);
    this.exporters = [0, 1].map((i) => new DcgmExporter(DCGM_GPUS[config.gpuName], config.numGpus, config.hostname, config.seed + i));
  }

  onPass(_rank: number, stats: PassStats): void {
    if (this.config.autoLoad && stats.generationTokens > 0) this.throughput.record(stats.generationTokens, performance.now());
  }

  /** Exporter `index` (0 or 1)'s scrape. */
  text(index: number): string {
    const now = performance.now();
    return this.exporters[index].text(this.config.autoLoad ? this.throughput.load(now) : 0, now);
  }
}
