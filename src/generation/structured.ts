import { badRequest } from '../wire/errors.js';
import { sampleJsonText, SampleTooLarge, UnsupportedSchema, unsupportedKeyword } from './jsonSchemaSample.js';
import { RegexUnsupported, sampleRegex } from './regexSample.js';
import { outputCharBudget } from './toolCalls.js';

/**
 * The constraint a request puts on its output (vLLM's StructuredOutputsParams). `refused`: one vLLM accepts but
 * mocker draws no output for (a grammar, a schema keyword it does not honour): refused when an output is to be
 * drawn, so that a captured answer is still replayed.
 */
export type StructuredOutput =
  | { kind: 'json'; schema: unknown }
  | { kind: 'json_object' }
  | { kind: 'regex'; pattern: string }
  | { kind: 'choice'; choices: string[] }
  | { kind: 'refused'; message: string; param: string };

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);
const given = (v: unknown) => v !== undefined && v !== null;

/** The constraint kinds of vLLM's StructuredOutputsParams, in the order its backends look at them. */
const KINDS = ['json', 'json_object', 'regex', 'choice', 'grammar', 'structural_tag'] as const;
type Kind = (typeof KINDS)[number];

/**
 * The request's output constraint as vLLM 0.11 builds it (`to_sampling_params`): `structured_outputs`, else the
 * deprecated `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`; `response_format` then sets
 * `json` (json_schema) or `json_object` on it. Several kinds at once are refused as vLLM refuses them; of the kinds
 * set, the first in vLLM's order wins (json, json_object, regex, choice). A grammar or structural tag is refused:
 * mocker draws no string from a grammar. Null: the output is free. `req`: the request body.
 */
export function structuredOutput(req: Record<string, unknown>): StructuredOutput | null {
  const params: Partial<Record<Kind, unknown>> = {};
  if (given(req.structured_outputs)) {
    if (!isObject(req.structured_outputs))
      throw badRequest('structured_outputs must be an object ({"json"|"regex"|"choice"|"grammar"|"json_object": …}).', 'structured_outputs');
    const so = req.structured_outputs;
    if (['json', 'regex', 'choice'].filter((k) => given(so[k])).length > 1) {
      throw badRequest("You can only use one kind of constraints for structured outputs ('json', 'regex' or 'choice').", 'structured_outputs');
    }
    for (const kind of KINDS) if (given(so[kind]) && so[kind] !== false) params[kind] = so[kind];
  } else {
    const legacy = {
      json: req.guided_json,
      regex: req.guided_regex,
      choice: req.guided_choice,
      grammar: req.guided_grammar,
      structural_tag: req.structural_tag,
    };
    for (const [kind, value] of Object.entries(legacy)) if (given(value)) params[kind as Kind] = value;
  }
  const set = KINDS.filter((k) => k in params);
  if (set.length > 1) {
    const names = given(req.structured_outputs) ? set.map((k) => `structured_outputs.${k}`) : set.map((k) => (k === 'structural_tag' ? k : `guided_${k}`));
    throw badRequest(`You can only use one kind of structured outputs constraint but multiple are specified: ${names.join(', ')}.`, names[0]);
  }
  const format = req.response_format;
  const field = (kind: string) => (given(req.structured_outputs) ? `structured_outputs.${kind}` : `guided_${kind}`);
  let jsonParam = field('json');
  if (given(format)) {
    const type = isObject(format) ? format.type : undefined;
    if (type === 'json_object') params.json_object = true;
    else if (type === 'json_schema') {
      const spec = isObject(format) ? format.json_schema : undefined;
      if (!isObject(spec) || typeof spec.name !== 'string')
        throw badRequest('response_format {"type": "json_schema"} needs "json_schema": {"name": …, "schema": {…}}.', 'response_format');
      params.json = spec.schema ?? {};
      jsonParam = 'response_format';
    } else if (type === 'structural_tag') params.structural_tag = format;
    else if (type !== 'text')
      throw badRequest(
        `response_format.type must be one of "text", "json_object", "json_schema" or "structural_tag", got ${JSON.stringify(type ?? null)}.`,
        'response_format',
      );
  }
  if ('json' in params) return jsonSchema(params.json, jsonParam);
  if ('json_object' in params) return { kind: 'json_object' };
  if ('regex' in params) {
    if (typeof params.regex !== 'string') throw badRequest(`${field('regex')} must be a string.`, field('regex'));
    return { kind: 'regex', pattern: params.regex };
  }
  if ('choice' in params) {
    const choices = params.choice;
    if (!Array.isArray(choices) || choices.length === 0 || !choices.every((c) => typeof c === 'string'))
      throw badRequest(`${field('choice')} must be a non-empty list of strings.`, field('choice'));
    return { kind: 'choice', choices };
  }
  if ('grammar' in params)
    return {
      kind: 'refused',
      message: `${field('grammar')}: mocker does not generate output from a grammar; use json, regex or choice.`,
      param: field('grammar'),
    };
  if ('structural_tag' in params)
    return {
      kind: 'refused',
      message: 'structural_tag: mocker does not generate output for structural tags; use json, regex or choice.',
      param: 'structural_tag',
    };
  return null;
}

/** A JSON schema given as an object or as its JSON text (`guided_json` takes both), checked for what mocker draws. */
function jsonSchema(value: unknown, param: string): StructuredOutput {
  let schema = value;
  if (typeof value === 'string') {
    try {
      schema = JSON.parse(value);
    } catch {
      throw badRequest(`${param}: the JSON schema is not valid JSON.`, param);
    }
  }
  if (!isObject(schema) && typeof schema !== 'boolean') throw badRequest(`${param}: a JSON schema must be an object.`, param);
  const unsupported = unsupportedKeyword(schema);
  if (unsupported)
    return {
      kind: 'refused',
      message: `${param}: the JSON schema uses \`${unsupported.keyword}\` (at ${unsupported.path}), which mocker does not generate values for.`,
      param,
    };
  return { kind: 'json', schema };
}

/**
 * The text of an answer the constraint accepts, drawn with `rand`, for an answer of at most `maxTokens` tokens.
 * `complete` false: no accepted text fits the budget (`maxTokens` × 8 characters, at most 256 KiB); `text` is then
 * the start of one, cut at the budget, as a model stopped by max_tokens leaves it.
 */
export function drawStructured(output: StructuredOutput, rand: () => number, maxTokens: number): { text: string; complete: boolean } {
  const budget = outputCharBudget(maxTokens);
  try {
    switch (output.kind) {
      case 'refused':
        throw badRequest(output.message, output.param);
      case 'json':
        return { text: sampleJsonText(output.schema, rand, budget), complete: true };
      case 'json_object':
        return {
          text: sampleJsonText({ type: 'object', additionalProperties: { type: ['string', 'integer', 'boolean'] }, minProperties: 1 }, rand, budget),
          complete: true,
        };
      case 'regex':
        try {
          return { text: sampleRegex(output.pattern, rand, budget), complete: true };
        } catch (err) {
          if (!(err instanceof RegexUnsupported && err.tooLong)) throw err;
          // vLLM's model writes a match until max_tokens stops it: the start of one drawn within the largest budget.
          return { text: sampleRegex(output.pattern, rand, outputCharBudget(Infinity)).slice(0, budget), complete: false };
        }
      case 'choice': {
        const choice = output.choices[Math.floor(rand() * output.choices.length)];
        return choice.length <= budget ? { text: choice, complete: true } : { text: choice.slice(0, budget), complete: false };
      }
    }
  } catch (err) {
    if (err instanceof SampleTooLarge) return { text: err.prefix, complete: false };
    if (err instanceof UnsupportedSchema) throw badRequest(err.message, output.kind === 'json' ? 'response_format' : null);
    if (err instanceof RegexUnsupported) throw badRequest(err.message, 'structured_outputs');
    throw err;
  }
}
