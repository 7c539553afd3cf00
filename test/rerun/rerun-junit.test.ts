import { describe, expect, it } from 'vitest';
import { validateXML } from 'xmllint-wasm';
import { junitXml } from '../../src/rerun/junit.js';
import type { RerunReport } from '../../src/rerun/report.js';
import { schemaErrors } from '../support/junitSchema.js';
import { HOSTILE_IN_XML, sampleReport, TEMPLATE_CHANGE } from '../support/rerunReports.js';

/** An XPath expression's value in the document, as libxml2 (xmllint --xpath) reads it. */
async function xpath(xml: string, expression: string): Promise<string> {
  const result = await validateXML({
    xml: { fileName: 'report.xml', contents: xml },
    normalization: 'format',
    modifyArguments: (args) => ['--xpath', expression, args[args.length - 1]],
  });
  return result.normalized.replace(/\n$/, '');
}

const testcase = (golden: number) => `/testsuites/testsuite/testcase[starts-with(@name, 'golden #${golden} ')]`;

describe('JUnit XML of mocker rerun', () => {
  it("is valid against Jenkins' JUnit schema, hostile request text included, and counts each verdict", async () => {
    const xml = junitXml(sampleReport());
    expect(await schemaErrors(xml)).toEqual([]);
    // JS strings can hold unpaired surrogates that no UTF-8 file can: the document itself must have none.
    expect(xml).not.toMatch(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/);

    expect(await xpath(xml, 'count(/testsuites/testsuite)')).toBe('1');
    expect(await xpath(xml, 'string(/testsuites/testsuite/@name)')).toBe('mocker rerun');
    for (const [attribute, value] of [
      ['tests', '5'],
      ['failures', '2'],
      ['errors', '0'],
      ['skipped', '1'],
    ]) {
      expect(await xpath(xml, `string(/testsuites/testsuite/@${attribute})`), attribute).toBe(value);
    }
    // Candidate end-to-end times: 1500 + 250 + (none) + 55 + 62.5 ms.
    expect(Number(await xpath(xml, 'string(/testsuites/testsuite/@time)'))).toBeCloseTo(1.8675, 3);
    expect(await xpath(xml, 'count(//testcase)')).toBe('5');
    expect(await xpath(xml, 'count(//testcase[failure])')).toBe('2');
    expect(await xpath(xml, 'count(//testcase[skipped])')).toBe('1');
    expect(await xpath(xml, 'count(//testcase[not(*)])')).toBe('1');

    expect(await xpath(xml, `string(${testcase(1)}/@name)`)).toBe(`golden #1 /v1/chat/completions (${HOSTILE_IN_XML})`);
    expect(await xpath(xml, `string(${testcase(1)}/@classname)`)).toBe('mocker.rerun.chat');
    expect(await xpath(xml, `string(${testcase(1)}/@time)`)).toBe('1.500');
    expect(await xpath(xml, `string(${testcase(3)}/@classname)`)).toBe('mocker.rerun.embeddings');
    expect(await xpath(xml, `string(${testcase(3)}/@time)`)).toBe('0.000');

    const properties = await xpath(
      xml,
      "concat(//property[@name='golden']/@value, ' | ', //property[@name='candidate']/@value, ' | ', //property[@name='target']/@value, ' | ', //property[@name='targetEngine']/@value, ' | ', //property[@name='targetVersion']/@value)",
    );
    expect(properties).toBe(`captures/golden.db | captures/rerun.db | http://127.0.0.1:8000/${HOSTILE_IN_XML} | vllm | 0.11.0`);
  });

  it('words each regression as a failure, a sampled difference as output, and a not-compared exchange as skipped', async () => {
    const xml = junitXml(sampleReport());
    const d = TEMPLATE_CHANGE.difference!;

    expect(await xpath(xml, `string(${testcase(1)}/failure/@message)`)).toBe('prompt changed in message 1 (user); output text changed');
    expect(await xpath(xml, `string(${testcase(1)}/failure/@type)`)).toBe('prompt, output');
    const failure = await xpath(xml, `string(${testcase(1)}/failure)`);
    expect(failure).toContain('Prompt differs at token 9, in the message 1 (user): golden token 872, candidate token 25312');
    expect(failure).toContain(`before:    ${JSON.stringify(d.before)}`);
    expect(failure).toContain(`golden:    ${JSON.stringify(d.goldenText)}`);
    expect(failure).toContain(`candidate: ${JSON.stringify(d.candidateText)}`);
    expect(failure).toContain('Output text differs (choice 0, at 2)');
    expect(failure).toContain(`candidate: Hey ${HOSTILE_IN_XML}`);

    expect(await xpath(xml, `string(${testcase(5)}/failure/@type)`)).toBe('output');
    const toolCalls = await xpath(xml, `string(${testcase(5)}/failure)`);
    expect(toolCalls).toContain('Output tool_calls differs (choice 0)');
    expect(toolCalls).toContain('golden:    {"city":"Paris"}');
    expect(toolCalls).toContain('candidate: {"city":"paris"}');

    expect(await xpath(xml, `count(${testcase(2)}/*)`)).toBe('1');
    const sampled = await xpath(xml, `string(${testcase(2)}/system-out)`);
    expect(sampled).toContain('sampled output differed');
    expect(sampled).toContain('Output text differs (choice 0, at 1)');

    expect(await xpath(xml, `string(${testcase(3)}/skipped)`)).toBe(`the target answered 404: model ${HOSTILE_IN_XML} does not exist`);
    expect(await xpath(xml, 'string(/testsuites/testsuite/system-out)')).toBe('Golden exchanges not sent: 2 failed, 1 bodies redacted');
  });

  it('passes every test case when nothing regressed, and leaves out a version the target did not give', async () => {
    const sample = sampleReport();
    const report: RerunReport = { ...sample, exchanges: [sample.exchanges[3]], skipped: [], targetVersion: null, regression: false };
    const xml = junitXml(report);
    expect(await schemaErrors(xml)).toEqual([]);
    expect(await xpath(xml, 'concat(/testsuites/testsuite/@tests, ",", /testsuites/testsuite/@failures, ",", /testsuites/testsuite/@skipped)')).toBe('1,0,0');
    expect(await xpath(xml, "count(//property[@name='targetVersion'])")).toBe('0');
    expect(await xpath(xml, 'count(/testsuites/testsuite/system-out)')).toBe('0');
  });

  it('the schema check rejects what the schema forbids (so the checks above can fail)', async () => {
    const valid = junitXml(sampleReport());
    expect(await schemaErrors(valid.replace('<skipped>', '<skipped message="x">'))).not.toEqual([]);
    expect(await schemaErrors(valid.replace('<testcase classname=', '<testcase nom=""  classname='))).not.toEqual([]);
    expect(await schemaErrors(valid.replace('captures/golden.db', 'captures/\u0001golden.db'))).not.toEqual([]);
    expect(await schemaErrors(valid.replace('</failure>', ']]></failure>'))).not.toEqual([]);
  });
});
