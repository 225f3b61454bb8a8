// Chromium as the browser scripts' harness: playwright-core driving the
// executable the Go test names, with no network of its own, no first-run
// UI and a fresh profile per browser (launchPersistentContext takes the
// --user-data-dir), removed when it closes.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync"];

// launch starts a browser of its own profile; close() ends it and removes
// the profile.
export async function launch(executablePath, options = {}) {
  const dir = mkdtempSync(join(tmpdir(), "capkernel-chromium-"));
  const ctx = await chromium.launchPersistentContext(dir, { executablePath, headless: true, args: ARGS, ...options });
  ctx.setDefaultTimeout(20000);
  const close = ctx.close.bind(ctx);
  ctx.close = async () => {
    await close();
    rmSync(dir, { recursive: true, force: true });
  };
  return ctx;
}

// signIn opens the console at url in a new page of ctx and signs in
// through the form with credential.
export async function signIn(ctx, url, credential) {
  const page = await ctx.newPage();
  await page.goto(url + "/console");
  await page.getByLabel("Credential").fill(credential);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.locator("#who-text").waitFor({ state: "visible" });
  return page;
}
