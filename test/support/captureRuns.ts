import Database from 'better-sqlite3';

/** The engine kind stored with each run of a capture file, read with SQLite directly (not mocker's store). */
export function runEngines(file: string): (string | null)[] {
  const db = new Database(file, { readonly: true });
  try {
    return (db.prepare('SELECT engine FROM runs ORDER BY id').all() as { engine: string | null }[]).map((r) => r.engine);
  } finally {
    db.close();
  }
}
