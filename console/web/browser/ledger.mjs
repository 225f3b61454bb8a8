// The Ledger view's witness in Chromium, against checkpoints a test
// server hands the page in turn. console/browser_test.go
// (TestBrowserLedgerOriginChange) serves them; this signs in and, for
// each phase, asks the server to move to it (GET cfg.url + phase), opens
// the Ledger view (the first phase) or refreshes it, and prints
// "PHASE <json>": {checks: [{class, text}], remembered: the witness's
// localStorage item}.
// Run: node browser/ledger.mjs CONFIG, CONFIG {url, credential, phases, chromium}.
import { readFileSync } from "node:fs";
import { launch, signIn } from "./chromium.mjs";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));
const ctx = await launch(cfg.chromium);
try {
  const page = await signIn(ctx, cfg.url, cfg.credential);
  for (const [i, phase] of cfg.phases.entries()) {
    const resp = await fetch(cfg.url + phase);
    if (!resp.ok) throw new Error(`phase ${phase}: HTTP ${resp.status}`);
    await page.locator("#ledger-checks").evaluate((e) => e.replaceChildren());
    // Opening the view checks the checkpoint; then Refresh does.
    if (i === 0) await page.locator('#nav button[data-view="ledger"]').click();
    else await page.locator("#ledger-refresh").click();
    await page.locator("#ledger-checks > *").first().waitFor();
    const out = await page.evaluate(() => ({
      checks: [...document.querySelectorAll("#ledger-checks li, #ledger-checks > p")].map((l) => ({ class: l.className, text: l.textContent })),
      remembered: localStorage.getItem("capkernel.console.checkpoints"),
    }));
    console.log("PHASE " + JSON.stringify(out));
  }
} finally {
  await ctx.close();
}
