import { describe, expect, it } from 'vitest';
import { parseMooncake, synthesizeTokens } from '../../src/trace/mooncake.js';

describe('Mooncake traces (§9.2 item 33)', () => {
  it('keeps a single row as written', () => {
    expect(parseMooncake('{"timestamp": 123, "input_length": 8, "output_length": 4, "hash_ids": [7, 8]}', 4)).toEqual([
      { line: 1, sessionId: 'request_0', timestampMs: 123, delayMs: 0, inputLength: 8, outputLength: 4, hashIds: [7, 8] },
    ]);
  });

  it('reads a later turn of a session with its delay', () => {
    const rows = parseMooncake(
      '{"session_id":"a","timestamp":1000,"output_length":1,"hash_ids":[1]}\n{"session_id":"a","delay":25,"output_length":1,"hash_ids":[1]}',
      4,
    );
    expect(rows[1].delayMs).toBe(25);
  });

  it('derives a missing input length from the hash ids, and tokens from the ids', () => {
    const [row] = parseMooncake('{"output_length": 1, "hash_ids": [1, 2]}', 4);
    expect(row.inputLength).toBe(8);
    expect([...synthesizeTokens([1, 2], 6, 4)]).toEqual([1, 1, 1, 1, 2, 2]);
  });

  it('names the line and field of bad rows', () => {
    expect(() => parseMooncake('{"output_length": 1, "hash_ids": [1]}\n{"hash_ids": [1]}')).toThrow(/line 2: output_length/);
    expect(() => parseMooncake('{"input_length": 9, "output_length": 1, "hash_ids": [1, 2]}', 4)).toThrow(/cannot hold input_length 9/);
    expect(() => parseMooncake('{"session_id":"s","delay":5,"output_length":1,"hash_ids":[1]}')).toThrow(/first turn/);
    expect(() => parseMooncake('\n\n')).toThrow(/no requests/);
  });
});
