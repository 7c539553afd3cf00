/**
 * Opening mocker's self-contained HTML reports in the system's Chromium (Debian's `chromium`, driven by
 * playwright-core), offline, with every console error, page error and request that leaves the file recorded.
 */
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { chromium, type Browser, type Page } from 'playwright-core';
import { testTmpdir } from './tempRoot.js';

function findChromium(): string {
  const found = (process.env.PATH ?? '')
    .split(delimiter)
    .map((dir) => join(dir, 'chromium'))
    .find((path) => existsSync(path));
  if (!found) throw new Error('Chromium is not installed (no `chromium` on PATH): install it with `apt-get install -y chromium` to run the HTML report tests');
  return found;
}

export function launchChromium(): Promise<Browser> {
  return chromium.launch({ executablePath: findChromium(), args: ['--no-sandbox'] });
}

export interface OpenedPage {
  page: Page;
  errors: string[];
  offFileRequests: string[];
}

/** Writes `html` to `path` and opens it from its file:// URL in a new offline page. */
export async function openHtmlFile(browser: Browser, path: string, html: string): Promise<OpenedPage> {
  writeFileSync(path, html);
  const page = await browser.newPage({ viewport: { width: 1200, height: 900 }, offline: true });
  const errors: string[] = [];
  const offFileRequests: string[] = [];
  page.on('console', (message) => {
    if (message.type() === 'error') errors.push(message.text());
  });
  page.on('pageerror', (error) => errors.push(error.message));
  page.on('request', (request) => {
    if (!request.url().startsWith('file:')) offFileRequests.push(request.url());
  });
  await page.goto(`file://${path}`);
  return { page, errors, offFileRequests };
}

/**
 * A test file's report pages: written to a temporary directory and opened in one browser, launched by the first
 * page (not in beforeAll: a missing Chromium then fails each test instead of skipping them). `close` in afterAll.
 */
export function reportPages(prefix: string): { dir: string; open(name: string, html: string): Promise<OpenedPage>; close(): Promise<void> } {
  const dir = mkdtempSync(join(testTmpdir(), prefix));
  let browser: Browser | undefined;
  return {
    dir,
    async open(name, html) {
      browser ??= await launchChromium();
      return openHtmlFile(browser, join(dir, `${name}.html`), html);
    },
    async close() {
      await browser?.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
