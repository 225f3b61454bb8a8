// The operator signs in to the console, then opens, in another tab of the
// same browser, a page served on another port of the console's host (a
// dev server, a notebook, an agent's preview…); that page asks its own
// server for a path under /console/, so the browser sends that server the
// console's cookie (cookies are not scoped by port). console/
// browser_test.go (TestBrowserCookieOfAnotherPort) serves both and checks
// that what the other server got opens no session.
// Run: node browser/otherport.mjs CONFIG, CONFIG {url, credential, other, chromium}.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));
const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const dir = mkdtempSync(join(tmpdir(), "capkernel-chromium-"));
const ctx = await chromium.launchPersistentContext(dir, { executablePath: cfg.chromium, headless: true, args: ARGS });
try {
  ctx.setDefaultTimeout(20000);
  const page = await ctx.newPage();
  await page.goto(cfg.url + "/console");
  await page.getByLabel("Credential").fill(cfg.credential);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#who-text").waitFor({ state: "visible" });
  console.log("signed in as", await page.locator("#who-text").textContent());
  const other = await ctx.newPage();
  await other.goto(cfg.other + "/");
  await other.locator("#done").waitFor({ state: "attached" });
  console.log("the other port's page:", await other.locator("#done").textContent());
  // The console's tab is still signed in: the other page took nothing
  // from it.
  await page.reload();
  await page.locator("#who-text").waitFor({ state: "visible" });
  console.log("the console's tab after a reload:", await page.locator("#who-text").textContent());
} finally {
  await ctx.close();
  rmSync(dir, { recursive: true, force: true });
}
