// The operator signs in to the console, then opens, in another tab of the
// same browser, a page served on another port of the console's host (a
// dev server, a notebook, an agent's preview…); that page asks its own
// server for a path under /console/, so the browser sends that server the
// console's cookie (cookies are not scoped by port). console/
// browser_test.go (TestBrowserCookieOfAnotherPort) serves both and checks
// that what the other server got opens no session.
// Run: node browser/otherport.mjs CONFIG, CONFIG {url, credential, other, chromium}.
import { readFileSync } from "node:fs";
import { launch, signIn } from "./chromium.mjs";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));
const ctx = await launch(cfg.chromium);
try {
  const page = await signIn(ctx, cfg.url, cfg.credential);
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
}
