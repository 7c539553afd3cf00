/**
 * The JUnit XML view of a rerun report (`mocker rerun --junit FILE`): one test case per exchange, as CI systems
 * (Jenkins, GitLab, GitHub's test reporters) read it. The shape follows Jenkins' JUnit schema (junit-4.xsd): one
 * suite in <testsuites>, a regression is a <failure>, an exchange not compared is <skipped> (its reason as the
 * element's text: that schema gives <skipped> no attributes, and Jenkins reads the text when there is no message).
 */
import type { ExchangeComparison, OutputDifference, PromptDifference, RerunReport } from './report.js';

/**
 * Characters XML 1.0 cannot hold even as references (C0 controls but tab, newline and carriage return; U+FFFE,
 * U+FFFF; a surrogate without its pair): request text is untrusted, so each becomes U+FFFD.
 */
const NOT_XML = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

const ENTITIES: Record<string, string> = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;', '\t': '&#9;', '\n': '&#10;', '\r': '&#13;' };

/** Text for an attribute value: tab, newline and carriage return as references, which attribute normalization keeps. */
function attr(text: string): string {
  return text.replace(NOT_XML, '\ufffd').replace(/[&<>"'\t\n\r]/g, (c) => ENTITIES[c]);
}

/** Text for element content (`>` too, so that `]]>` cannot appear; `\r` as a reference, which parsers keep). */
function content(text: string): string {
  return text.replace(NOT_XML, '\ufffd').replace(/[&<>\r]/g, (c) => ENTITIES[c]);
}

const seconds = (ms: number) => (ms / 1000).toFixed(3);

function describePrompt(d: PromptDifference): string {
  const token = (id: number | null) => (id === null ? 'none (the prompt ends)' : String(id));
  return [
    `Prompt differs at token ${d.position}, in the ${d.partLabel}: golden token ${token(d.goldenToken)}, candidate token ${token(d.candidateToken)}`,
    `  before:    ${JSON.stringify(d.before)}`,
    `  golden:    ${JSON.stringify(d.goldenText)}`,
    `  candidate: ${JSON.stringify(d.candidateText)}`,
  ].join('\n');
}

function describeOutput(d: OutputDifference): string {
  const where = [d.choice === undefined ? null : `choice ${d.choice}`, d.position === undefined ? null : `at ${d.position}`].filter((part) => part !== null);
  return [`Output ${d.field} differs${where.length > 0 ? ` (${where.join(', ')})` : ''}`, `  golden:    ${d.golden}`, `  candidate: ${d.candidate}`].join('\n');
}

/** Every difference of the exchange, in words, one paragraph each. */
function describeDifferences(exchange: ExchangeComparison): string {
  const prompt = exchange.prompt?.difference;
  return [...(prompt ? [describePrompt(prompt)] : []), ...exchange.output.differences.map(describeOutput)].join('\n');
}

/** What changed, for the failure's type: `prompt`, `output`, both, or `regression` when neither says (a failure). */
function failureType(exchange: ExchangeComparison): string {
  const kinds = [exchange.prompt?.difference ? 'prompt' : null, exchange.output.differences.length > 0 ? 'output' : null].filter((kind) => kind !== null);
  return kinds.length > 0 ? kinds.join(', ') : 'regression';
}

function testcase(exchange: ExchangeComparison): string {
  const name = `golden #${exchange.golden} ${exchange.path}${exchange.model === null ? '' : ` (${exchange.model})`}`;
  const time = seconds(exchange.timing.candidate?.e2eMs ?? 0);
  const open = `<testcase classname="${attr(`mocker.rerun.${exchange.endpoint}`)}" name="${attr(name)}" time="${time}"`;
  const differences = describeDifferences(exchange);
  switch (exchange.verdict) {
    case 'same':
      return `${open}/>`;
    case 'regression':
      return `${open}><failure message="${attr(exchange.note ?? (differences.split('\n')[0] || 'regression'))}" type="${attr(failureType(exchange))}">${content(differences)}</failure></testcase>`;
    case 'not-compared':
      return `${open}><skipped>${content(exchange.note ?? 'not compared')}</skipped></testcase>`;
    case 'sampled': {
      const out = [
        `The sampled output differed (a sampled request without a seed: reported, not failed).${exchange.note ? ` ${exchange.note}` : ''}`,
        differences,
      ];
      return `${open}><system-out>${content(out.join('\n'))}</system-out></testcase>`;
    }
  }
}

export function junitXml(report: RerunReport): string {
  const exchanges = report.exchanges;
  const count = (verdict: ExchangeComparison['verdict']) => exchanges.filter((exchange) => exchange.verdict === verdict).length;
  const failures = count('regression');
  const time = seconds(exchanges.reduce((sum, exchange) => sum + (exchange.timing.candidate?.e2eMs ?? 0), 0));
  const properties: [string, string | null][] = [
    ['golden', report.golden],
    ['candidate', report.candidate],
    ['target', report.target],
    ['targetEngine', report.targetEngine],
    ['targetVersion', report.targetVersion],
  ];
  const propertyLines = properties.flatMap(([name, value]) => (value === null ? [] : [`<property name="${name}" value="${attr(value)}"/>`]));
  const notSent = report.skipped.map(({ reason, count }) => `${count} ${reason}`);
  const lines = [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<testsuites name="mocker rerun" tests="${exchanges.length}" failures="${failures}" errors="0" time="${time}">`,
    `<testsuite name="mocker rerun" tests="${exchanges.length}" failures="${failures}" errors="0" skipped="${count('not-compared')}" time="${time}">`,
    `<properties>${propertyLines.join('')}</properties>`,
    ...exchanges.map(testcase),
    ...(notSent.length > 0 ? [`<system-out>${content(`Golden exchanges not sent: ${notSent.join(', ')}`)}</system-out>`] : []),
    '</testsuite>',
    '</testsuites>',
    '',
  ];
  return lines.join('\n');
}
