/** A whole streamed answer's JSON events in order, `[DONE]` left out; throws when the stream did not end with `[DONE]`. */
export function jsonEvents(text: string): Record<string, unknown>[] {
  if (!text.endsWith('data: [DONE]\n\n')) throw new Error(`the stream does not end with [DONE]: ${JSON.stringify(text.slice(-200))}`);
  return text
    .split('\n\n')
    .filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6)) as Record<string, unknown>);
}
