/**
 * Leveled logs (`--log-level`, `--log-format`, `--access-logs`): debug and info lines on stdout, warnings and errors
 * on stderr, as text or as JSON lines (`{"time","level","msg",…fields}`). Each thread of a server configures its own.
 */
export const LOG_LEVELS = ['debug', 'info', 'warning', 'error'] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];
export const LOG_FORMATS = ['text', 'json'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

export interface LogConfig {
  level: LogLevel;
  format: LogFormat;
}

/** `--log-level` and `--log-format` left out. */
export const DEFAULT_LOG_CONFIG: LogConfig = { level: 'info', format: 'text' };

let config: LogConfig = DEFAULT_LOG_CONFIG;

/** The given settings over the defaults. */
export function configureLogs(next: Partial<LogConfig> = {}): void {
  config = { level: next.level ?? DEFAULT_LOG_CONFIG.level, format: next.format ?? DEFAULT_LOG_CONFIG.format };
}

export const logsAt = (level: LogLevel): boolean => LOG_LEVELS.indexOf(level) >= LOG_LEVELS.indexOf(config.level);

function write(level: LogLevel | 'start', message: string, fields: Record<string, unknown> | undefined): void {
  const line = config.format === 'json' ? JSON.stringify({ time: new Date().toISOString(), level, msg: message, ...fields }) : message;
  if (level === 'warning' || level === 'error') process.stderr.write(`${line}\n`);
  else process.stdout.write(`${line}\n`);
}

/** A line at `level`, written when the configured level lets it through; `fields` go into JSON lines only. */
export function log(level: LogLevel, message: string, fields?: Record<string, unknown>): void {
  if (logsAt(level)) write(level, message, fields);
}

/** The line a server prints once it listens: at every level, since scripts and supervisors wait for it. */
export function logStart(message: string, fields?: Record<string, unknown>): void {
  write('start', message, fields);
}
