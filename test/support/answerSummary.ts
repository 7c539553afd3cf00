type Json = Record<string, unknown>;

/** Text, finish reason, usage and (when present) output ids of an OpenAI-shaped answer, streamed or not. */
export function answerSummary(chat: boolean, stream: boolean, text: string): { content: string; finish: unknown; usage: unknown; ids: number[] | null } {
  const chunks: Json[] = stream
    ? text
        .split('\n')
        .filter((l) => l.startsWith('data: ') && l !== 'data: [DONE]')
        .map((l) => JSON.parse(l.slice(6)) as Json)
    : [JSON.parse(text) as Json];
  let content = '';
  let finish: unknown = null;
  let usage: unknown = null;
  let ids: number[] | null = null;
  for (const chunk of chunks) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of (chunk.choices ?? []) as Json[]) {
      const piece = chat ? ((stream ? (c.delta as Json) : (c.message as Json))?.content ?? '') : (c.text ?? '');
      content += String(piece);
      if (c.finish_reason != null) finish = c.finish_reason;
      if (Array.isArray(c.token_ids)) ids = [...(ids ?? []), ...(c.token_ids as number[])];
    }
  }
  return { content, finish, usage, ids };
}
