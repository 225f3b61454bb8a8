// Browser tests of the operator's console: playwright-core driving
// Debian's Chromium against a kernel served on loopback. console/
// browser_test.go starts the kernel, writes the config file named by the
// first argument, runs this file with node, and checks the kernel's side
// afterwards (files committed or not). Run: node browser/console.mjs CONFIG.
//
// The config: {url, admin, alice, bob (approver credentials), carol (an
// escalation approver's), dave (an auditor credential), agent
// {token, id, agent_id}, policy_hash, ws (the agent's workspace),
// artifacts (where screenshots go), chromium (the executable)}.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { launch, signIn as signInAt } from "./chromium.mjs";

const cfg = JSON.parse(readFileSync(process.argv[2], "utf8"));

const browser = () => launch(cfg.chromium, { viewport: { width: 1366, height: 768 } });

let alice, bob; // two people's browsers (separate profiles, separate cookies)

before(async () => {
  alice = await browser();
  bob = await browser();
});

after(async () => {
  await alice?.close();
  await bob?.close();
});

// signIn opens the console in a new page of ctx, signed out, and signs
// in through the form.
async function signIn(ctx, credential) {
  await ctx.clearCookies();
  return signInAt(ctx, cfg.url, credential);
}

// SESSION_KEY is where the page keeps its session key (sessionStorage);
// a fetch in the page sends it as the page's own requests do.
const SESSION_KEY = "capkernel.console.key";

async function shot(page, name) {
  await page.screenshot({ path: join(cfg.artifacts, name + ".png"), fullPage: true });
}

// ---- the agent's side, over the kernel's HTTP API ----

let nextKey = 0;

// startCall starts a call of the agent in the background (Prefer:
// respond-async) and returns its operation id.
async function startCall(tool, args) {
  const env = {
    tool_id: tool, args, agent_id: cfg.agent.agent_id, capability_token: cfg.agent.token,
    capability_token_id: cfg.agent.id, policy_hash: cfg.policy_hash, idempotency_key: "browser-" + nextKey++,
  };
  const resp = await fetch(cfg.url + "/v1/syscalls", {
    method: "POST", headers: { "Content-Type": "application/json", Prefer: "respond-async" }, body: JSON.stringify(env),
  });
  const body = await resp.text();
  assert.equal(resp.status, 202, "starting " + tool + ": " + body);
  return JSON.parse(body).operation_id;
}

// result waits for the operation's result envelope.
async function result(id) {
  for (;;) {
    const resp = await fetch(cfg.url + "/v1/operations/" + id, { headers: { Authorization: "Bearer " + cfg.agent.token } });
    if (resp.status === 200) return resp.json();
    assert.equal(resp.status, 202, "operation " + id);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// expectSoon waits up to 20 s for cond to hold.
async function expectSoon(cond, what) {
  for (const end = Date.now() + 20000; !cond(); ) {
    assert.ok(Date.now() < end, "timed out waiting: " + what);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// card is the pending approval card of operation id on page: it must
// appear without a reload, from the live event stream.
function card(page, id) {
  return page.locator("#approvals-list li").filter({ hasText: id });
}

function decidedCard(page, id) {
  return page.locator("#decided-list li").filter({ hasText: id });
}

// ---- the tests ----

let approved; // the result of the approved fs.write

test("a gated fs.write is approved end to end and committed", async () => {
  const page = await signIn(alice, cfg.alice);
  const id = await startCall("fs.write", { path: join(cfg.ws, "notes.txt"), content: "status: final\nowner: ops\n" });
  const c = card(page, id);
  await c.waitFor();
  // The card shows what the call would do: a diff against the file.
  const diff = c.getByRole("region", { name: "Diff of notes.txt" });
  await diff.locator(".del", { hasText: "status: draft" }).waitFor();
  await diff.locator(".add", { hasText: "status: final" }).waitFor();
  assert.match(await c.textContent(), /soft_gate/);
  await shot(page, "approvals");
  await c.getByLabel("Reason").fill("reviewed the diff");
  await c.getByRole("button", { name: "Approve" }).click();
  await decidedCard(page, id).locator(".state.allowed").waitFor();
  assert.equal(await card(page, id).count(), 0);
  approved = await result(id);
  assert.equal(approved.status, "ok", JSON.stringify(approved.error));
  assert.equal(approved.tx_outcome, "committed");
  await page.close();
});

// An agent's gated rewrite of a long file with other lines: the page
// diffed it unbounded on its only thread, for 45 s with 12,001 lines
// each side (rev10-approve F1), no Approve or Deny meanwhile. Bounded,
// the card says it is too different to diff and shows the new content.
test("a rewrite too different to diff is shown as its new content, and the page answers", async () => {
  const lines = (prefix) => Array.from({ length: 12001 }, (_, i) => prefix + i).join("\n") + "\n";
  writeFileSync(join(cfg.ws, "big.txt"), lines("old line "));
  const page = await signIn(alice, cfg.alice);
  const id = await startCall("fs.write", { path: join(cfg.ws, "big.txt"), content: lines("new line ") });
  const c = card(page, id);
  await c.locator(".too-different", { hasText: "Too different to diff here: 12001 lines before, 12001 after." }).waitFor();
  const shown = await c.locator("pre.content").textContent();
  assert.ok(shown.startsWith("new line 0\nnew line 1\n"), shown.slice(0, 40));
  assert.match(await c.locator(".hidden-lines").textContent(), /^7001 more lines not shown here/);
  assert.equal(await c.locator(".diff").count(), 0);
  assert.equal(await page.evaluate(() => 1), 1);
  await c.getByRole("button", { name: "Deny" }).click();
  await decidedCard(page, id).locator(".state.denied").waitFor();
  await page.close();
});

// A card's detail (arguments, file, diff) is fetched when the card comes
// on screen, not for every pending card at load: the page fetched them
// all, up to 256 requests of every agent, each up to ~1.3 MiB.
test("a card's detail is loaded when the card is shown", async () => {
  const page = await alice.newPage();
  await page.addInitScript(() => {
    const fetch = window.fetch;
    window.fetched = [];
    window.fetch = (url, opts) => {
      window.fetched.push(String(url));
      return fetch(url, opts);
    };
  });
  const ids = [];
  for (let i = 0; i < 8; i++) ids.push(await startCall("fs.write", { path: join(cfg.ws, `lazy-${i}.txt`), content: `lazy ${i}\n` }));
  await alice.clearCookies();
  await page.goto(cfg.url + "/console");
  await page.getByLabel("Credential").fill(cfg.alice);
  await page.getByRole("button", { name: "Sign in" }).click();
  const cards = page.locator("#approvals-list > li");
  await cards.nth(7).waitFor({ state: "attached" });
  assert.equal(await cards.count(), 8);
  const [first, last] = [cards.first(), cards.last()];
  await first.locator(".diff .add").waitFor();
  const approval = await last.getAttribute("data-id");
  const detailed = () => page.evaluate((a) => window.fetched.filter((u) => u.endsWith("/console/api/approvals/" + encodeURIComponent(a))).length, approval);
  assert.equal(await detailed(), 0, "the last card's detail was fetched before it was shown");
  assert.match(await last.locator(".detail").textContent(), /^Loading the arguments/);
  await last.scrollIntoViewIfNeeded();
  await last.locator(".diff .add", { hasText: /\+ lazy \d$/ }).waitFor();
  assert.equal(await detailed(), 1);
  for (const id of ids) {
    await card(page, id).getByRole("button", { name: "Deny" }).click();
    await decidedCard(page, id).locator(".state.denied").waitFor();
  }
  await page.close();
});

// The detail titles a file with where the call acts, not the agent's
// spelling: through a link inside the workspace an approver saw a diff
// titled "docs/ci.yml" for a write to .github/workflows/ci.yml; and it
// says what a deleted directory holds, where it said "now 0 bytes" and
// "Not text: no diff" (rev10-approve F9).
test("the detail names where a write lands and what a deleted directory holds", async () => {
  mkdirSync(join(cfg.ws, ".github", "workflows"), { recursive: true });
  writeFileSync(join(cfg.ws, ".github", "workflows", "ci.yml"), "on: push\n");
  symlinkSync(join(".github", "workflows"), join(cfg.ws, "docs"));
  for (let i = 0; i < 12; i++) {
    mkdirSync(join(cfg.ws, "tree", "d" + (i % 3)), { recursive: true });
    writeFileSync(join(cfg.ws, "tree", "d" + (i % 3), `f${i}`), "x".repeat(100));
  }
  const page = await signIn(alice, cfg.carol);
  const write = await startCall("fs.write", { path: join(cfg.ws, "docs", "ci.yml"), content: "on: pull_request\n" });
  const del = await startCall("fs.delete", { path: join(cfg.ws, "tree") });
  const w = card(page, write), d = card(page, del);
  const diff = w.getByRole("region", { name: "Diff of .github/workflows/ci.yml" });
  await diff.locator(".add", { hasText: "on: pull_request" }).waitFor();
  assert.equal(await w.locator("h4", { hasText: "ci.yml" }).textContent(), ".github/workflows/ci.yml (now 9 bytes, spelled docs/ci.yml)");
  // A card's detail loads once the card is on screen (detailWatch): the
  // delete's card may lie below the write's diff, as an approver scrolls.
  await d.scrollIntoViewIfNeeded();
  await d.locator("p.dir").waitFor();
  assert.equal(await d.locator("h4").last().textContent(), "tree (directory)");
  assert.equal(await d.locator("p.dir").textContent(), "A directory of 15 entries (at any depth), 1200 bytes in files.");
  for (const id of [write, del]) {
    await card(page, id).getByRole("button", { name: "Deny" }).click();
    await decidedCard(page, id).locator(".state.denied").waitFor();
  }
  await page.close();
});

let denied; // the result of the denied fs.write, whose payload is erased later

test("a denied call is refused and writes nothing", async () => {
  const page = await signIn(alice, cfg.alice);
  const id = await startCall("fs.write", { path: join(cfg.ws, "denied.txt"), content: "must not exist\n" });
  const c = card(page, id);
  await c.getByLabel("Reason").fill("not today");
  await c.getByRole("button", { name: "Deny" }).click();
  await decidedCard(page, id).locator(".state.denied").waitFor();
  const r = await result(id);
  assert.equal(r.status, "error");
  assert.equal(r.error.class, "approval_denied");
  assert.notEqual(r.tx_outcome, "committed");
  denied = r;
  await page.close();
});

test("a list fetched before a live request arrives does not hide it", async () => {
  // A page of its own, holding the signed-in tab's session key (as that
  // tab's reload would), and every approvals list fetch held below is
  // this page's. (Holding on the sign-in page itself and reloading it
  // could count that page's late fetch as one of the new page's two, and
  // start the call before the new page's event stream was open.)
  const first = await signIn(alice, cfg.alice);
  const key = await first.evaluate((k) => sessionStorage.getItem(k), SESSION_KEY);
  await first.close();
  const page = await alice.newPage();
  await page.addInitScript(([k, v]) => sessionStorage.setItem(k, v), [SESSION_KEY, key]);
  // Hold every approvals list the page fetches: each is answered by the
  // server at once, but delivered only after the call below was shown
  // live, as a slow network would.
  let release;
  const gate = new Promise((r) => (release = r));
  const held = [];
  await page.route("**/console/api/approvals?all=true", async (route) => {
    const resp = await route.fetch();
    held.push(resp);
    await gate;
    await route.fulfill({ response: resp });
  });
  await page.goto(cfg.url + "/console"); // signed in by its key: one list fetch, and one when the event stream opens
  await expectSoon(() => held.length >= 2, "the page fetched the approvals list twice");
  const id = await startCall("fs.write", { path: join(cfg.ws, "stale.txt"), content: "stale\n" });
  await card(page, id).waitFor();
  const delivered = Promise.all(held.map(() => page.waitForResponse((r) => r.url().endsWith("/console/api/approvals?all=true"))));
  release();
  await delivered;
  await page.evaluate(() => new Promise((r) => setTimeout(r, 200))); // let the page apply them
  assert.equal(await card(page, id).count(), 1, "the stale list removed the live request");
  await card(page, id).getByRole("button", { name: "Deny" }).click();
  await decidedCard(page, id).locator(".state.denied").waitFor();
  await page.close();
});

test("two consoles race on one decision: the first wins, both show it", async () => {
  const pa = await signIn(alice, cfg.alice);
  const pb = await signIn(bob, cfg.bob);
  // The state a console shows for operation id once it is decided.
  const state = async (p, id) => {
    const d = decidedCard(p, id).locator(".state");
    await d.waitFor();
    return d.textContent();
  };

  // Both click at once. Exactly one decision is taken; the other console
  // is told someone decided first, or its card went away under it, live.
  let id = await startCall("fs.write", { path: join(cfg.ws, "race.txt"), content: "raced\n" });
  await Promise.all([card(pa, id).waitFor(), card(pb, id).waitFor()]);
  const click = (p, name) => p.evaluate(([id, name]) => {
    const li = [...document.querySelectorAll("#approvals-list li")].find((li) => li.textContent.includes(id));
    const b = li && [...li.querySelectorAll("button")].find((b) => b.textContent === name);
    if (!b) return "gone";
    b.click();
    return "clicked";
  }, [id, name]);
  const clicked = await Promise.all([click(pa, "Approve"), click(pb, "Deny")]);
  const [sa, sb] = await Promise.all([state(pa, id), state(pb, id)]);
  assert.equal(sa, sb, "the two consoles show different decisions");
  const r = await result(id);
  assert.equal(r.status === "ok", sa === "allowed", `result ${r.status} after ${sa}`);
  let won = 0;
  for (const [i, p] of [pa, pb].entries()) {
    const s = await p.locator("#status").textContent();
    if (/^(Approved|Denied) fs.write by/.test(s)) won++;
    else if (clicked[i] === "clicked") assert.match(s, /Someone decided first/);
  }
  assert.equal(won, 1, "consoles whose decision was taken");

  // A console that missed the decision (its event stream is cut) and
  // decides late gets the first decision back, and shows it.
  await pb.route("**/console/api/events", (route) => route.abort());
  id = await startCall("fs.write", { path: join(cfg.ws, "late.txt"), content: "late\n" });
  await card(pa, id).waitFor();
  await pb.reload();
  await card(pb, id).waitFor();
  await card(pa, id).getByRole("button", { name: "Deny" }).click();
  await decidedCard(pa, id).locator(".state.denied").waitFor();
  await card(pb, id).getByRole("button", { name: "Approve" }).click();
  await decidedCard(pb, id).locator(".state.denied").waitFor();
  assert.match(await pb.locator("#status").textContent(), /Someone decided first: denied by alice/);
  assert.equal((await result(id)).error.class, "approval_denied");
  await pa.close();
  await pb.close();
});

test("a receipt is verified in the page, and a tampered one refused", async () => {
  assert.ok(approved, "needs the approved call's receipt");
  const page = await signIn(alice, cfg.alice);
  await page.getByRole("button", { name: "History" }).click();
  const row = page.locator(`#history-table tr[data-receipt="${approved.receipt_id}"]`);
  await row.click();
  await page.getByRole("button", { name: "Verify this receipt in the browser" }).click();
  await page.locator('#detail-checks[data-verdict="pass"]').waitFor();
  assert.equal(await page.locator('#detail-checks li[data-state="fail"]').count(), 0);
  await shot(page, "history");

  const bundle = await page.evaluate(async ([id, k]) => (await fetch(`/console/api/receipts/${id}/bundle`, { headers: { "X-Console-Key": sessionStorage.getItem(k) } })).json(), [approved.receipt_id, SESSION_KEY]);
  const verify = async (b) => {
    await page.getByRole("button", { name: "Verify", exact: true }).first().click();
    await page.getByLabel("or paste the bundle JSON").fill(JSON.stringify(b));
    await page.locator("#verify-form").getByRole("button", { name: "Verify" }).click();
  };
  await verify(bundle);
  await page.locator('#verify-checks[data-verdict="pass"]').waitFor();
  // Tampered: the receipt's audit entry says another tool; its hash no
  // longer recomputes, and the page says which check failed.
  assert.equal(bundle.format, "capkernel-receipt/v2");
  await verify({ ...bundle, entry: bundle.entry.replace('"tool_id":"fs.write"', '"tool_id":"fs.delete"') });
  await page.locator('#verify-checks[data-verdict="fail"]').waitFor();
  await page.locator('#verify-checks li[data-check="entry"][data-state="fail"]').waitFor();
  assert.match(await page.locator("#verify-checks .verdict").textContent(), /^Not verified: .+ failed\.$/);
  await shot(page, "verify");
  await page.close();
});

test("CSRF: a request without the session key, and one from a foreign origin, are refused", async () => {
  const page = await signIn(alice, cfg.alice);
  const id = await startCall("fs.write", { path: join(cfg.ws, "csrf.txt"), content: "forged\n" });
  await card(page, id).waitFor();
  const approval = await card(page, id).getAttribute("data-id");
  const path = "/console/api/approvals/" + encodeURIComponent(approval);

  // Same origin, signed in (the cookie goes along), but no X-Console-Key.
  const noKey = await page.evaluate(async (path) => {
    const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: '{"decision":"allow"}' });
    return r.status;
  }, path);
  assert.equal(noKey, 401);

  // Another origin of the same site (another port of 127.0.0.1): the
  // browser sends the SameSite=Strict cookie along, so only the origin
  // check stands between a forged form and the decision.
  const foreign = "http://127.0.0.1:1";
  await page.route(foreign + "/**", (route) => route.fulfill({
    contentType: "text/html",
    body: `<form method="post" enctype="text/plain" action="${cfg.url}${path}"><input name='{"decision":"allow","x":"' value='"}'></form>`,
  }));
  await page.goto(foreign + "/evil.html");
  const [resp] = await Promise.all([
    page.waitForResponse((r) => r.url() === cfg.url + path),
    page.locator("form").evaluate((f) => f.submit()),
  ]);
  assert.equal(resp.status(), 403);
  assert.match(await resp.text(), /cross-origin|Content-Type|X-Console-Key/i);

  // The call is still waiting: nothing decided it. Deny it properly.
  await page.goto(cfg.url + "/console");
  const c = card(page, id);
  await c.waitFor();
  await c.getByRole("button", { name: "Deny" }).click();
  await decidedCard(page, id).locator(".state.denied").waitFor();
  assert.equal((await result(id)).error.class, "approval_denied");
  await page.close();
});

// openRecord opens the History view of page and the record of receipt id.
async function openRecord(page, id) {
  await page.getByRole("button", { name: "History" }).click();
  await page.locator(`#history-table tr[data-receipt="${id}"]`).click();
  await page.locator("#detail-payload-state[data-state]").waitFor();
}

test("an auditor reads a record's payload and checks its commitments in the page, read-only", async () => {
  assert.ok(approved, "needs the approved call");
  const page = await signIn(bob, cfg.dave);
  assert.match(await page.locator("#who-text").textContent(), /\(auditor\)/);
  await openRecord(page, approved.receipt_id);
  assert.equal(await page.locator("#detail-payload-state").getAttribute("data-state"), "kept");
  assert.match(await page.locator('#detail-payload pre[data-part="args"]').textContent(), /status: final/);
  assert.match(await page.locator('#detail-payload pre[data-part="result"]').textContent(), /"status": "ok"/);
  await page.locator('#detail-payload pre[data-part="policy_input"]').waitFor();
  await page.getByRole("button", { name: "Check the commitments against the payload" }).click();
  await page.locator('#detail-commitments[data-verdict="pass"]').waitFor();
  for (const part of ["args", "result", "policy_input", "context"]) {
    assert.equal(await page.locator(`#detail-commitments li[data-part="${part}"]`).getAttribute("data-state"), "matches", part);
  }
  assert.match(await page.locator("#detail-operation").textContent(), /"audit_salt"/);
  await shot(page, "audit");
  // Read-only: no decision or revoke controls.
  await page.getByRole("button", { name: "Tokens" }).click();
  await page.locator(`#tokens-table tr[data-jti="${cfg.agent.id}"]`).waitFor();
  assert.equal(await page.locator("#tokens-table button:visible").count(), 0, "an auditor is offered Revoke");
  const id = await startCall("fs.write", { path: join(cfg.ws, "audited.txt"), content: "x\n" });
  await page.getByRole("button", { name: "Approvals" }).click();
  const c = card(page, id);
  await c.locator(".read-only").waitFor();
  assert.equal(await c.getByRole("button").count(), 0, "an auditor is offered a decision");
  await page.close();
  // Deny it as an approver, so nothing stays pending.
  const pa = await signIn(alice, cfg.alice);
  await card(pa, id).getByRole("button", { name: "Deny" }).click();
  await decidedCard(pa, id).locator(".state.denied").waitFor();
  await pa.close();
});

test("an approver does not see another agent's payload", async () => {
  const page = await signIn(alice, cfg.alice);
  await openRecord(page, approved.receipt_id);
  assert.equal(await page.locator("#detail-payload-state").getAttribute("data-state"), "withheld");
  assert.equal(await page.locator("#detail-payload pre").count(), 0);
  await page.locator("#detail-operation", { hasText: "Withheld" }).waitFor();
  await page.getByRole("button", { name: "Check the commitments against the payload" }).click();
  await page.locator('#detail-commitments[data-verdict="withheld"]').waitFor();
  assert.doesNotMatch(await page.locator("#history-detail").textContent(), /status: final/);
  // Nor from the console's API, whatever the page asks.
  const answers = await page.evaluate(async ([rid, op, k]) => Promise.all(
    [`/console/api/receipts/${rid}/record`, `/console/api/operations/${op}`, `/console/api/receipts?agent=${"a1"}`, `/console/api/receipts/${rid}/bundle`]
      .map(async (p) => {
        const r = await fetch(p, { headers: { "X-Console-Key": sessionStorage.getItem(k) } });
        return [r.status, await r.text()];
      })), [approved.receipt_id, approved.operation_id, SESSION_KEY]);
  for (const [status, a] of answers) {
    assert.notEqual(status, 401, "the page's own key was refused");
    assert.doesNotMatch(a, /status: final/);
  }
  await page.close();
});

test("an erased payload is shown as erased, with its erasure record, not as tampered", async () => {
  assert.ok(denied, "needs the denied call");
  const resp = await fetch(cfg.url + "/v1/admin/ledger/erase", {
    method: "POST", headers: { "Content-Type": "application/json", Authorization: "Bearer " + cfg.admin },
    body: JSON.stringify({ operation_id: denied.operation_id, reason: "browser test: right to erasure" }),
  });
  assert.equal(resp.status, 200, await resp.text());
  const page = await signIn(bob, cfg.dave);
  await openRecord(page, denied.receipt_id);
  assert.equal(await page.locator("#detail-payload-state").getAttribute("data-state"), "erased");
  assert.match(await page.locator("#detail-erasure").textContent(), /browser test: right to erasure/);
  await page.getByRole("button", { name: "Check the commitments against the payload" }).click();
  await page.locator('#detail-commitments[data-verdict="erased"]').waitFor();
  assert.equal(await page.locator('#detail-commitments li[data-state="erased"]').count(), 4);
  assert.equal(await page.locator('#detail-commitments li.fail').count(), 0);
  assert.doesNotMatch(await page.locator("#detail-commitments").textContent(), /Tampered/);
  await shot(page, "erased");
  await page.close();
});

test("screenshots of the sign-in, ledger and tokens views", async () => {
  await alice.clearCookies();
  const login = await alice.newPage();
  await login.goto(cfg.url + "/console");
  await login.getByLabel("Credential").waitFor();
  await shot(login, "login");
  await login.close();

  const page = await signIn(alice, cfg.admin);
  await page.getByRole("button", { name: "Ledger" }).click();
  await page.locator("#ledger-checks li.pass").first().waitFor();
  assert.equal(await page.locator("#ledger-checks li.fail").count(), 0);
  await shot(page, "ledger");
  await page.getByRole("button", { name: "Tokens" }).click();
  await page.locator(`#tokens-table tr[data-jti="${cfg.agent.id}"]`).waitFor();
  await shot(page, "tokens");
  await page.close();
});
