// The console's commitment check (src/commitments.js) against the golden
// vectors kernel/testdata/commitments.json, and each part state of
// openPayload. Run: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as c from "../src/commitments.js";
import { hex } from "../src/verify.js";

const vectors = JSON.parse(readFileSync(new URL("../../../kernel/testdata/commitments.json", import.meta.url), "utf8"));

test("commitment vectors: part keys and commitments", () => {
  assert.ok(vectors.length >= 8);
  for (const v of vectors) {
    const name = v.part + " under " + v.salt.slice(0, 8);
    assert.equal(hex(c.partKey(v.salt, v.part)), v.key, name);
    assert.equal(c.commit(c.partKey(v.salt, v.part), new TextEncoder().encode(v.canonical)), v.commitment, name);
    // From the parsed value: the page canonicalizes what it was sent.
    assert.equal(c.commitPart(v.salt, v.part, JSON.parse(v.canonical)), v.commitment, name);
  }
  assert.throws(() => c.partKey("00", "args"), /salt/);
  assert.throws(() => c.partKey(vectors[0].salt.toUpperCase(), "args"), /salt/);
});

// A record of the vectors' first salt committing to each part's first vector.
function record() {
  const salt = vectors[0].salt;
  const body = { payload_depth: "full" };
  const payload = { salt };
  for (const p of c.PARTS) {
    const v = vectors.find((x) => x.salt === salt && x.part === p);
    body[p + "_commitment"] = v.commitment;
    payload[p] = JSON.parse(v.canonical);
  }
  return { body, payload };
}

test("openPayload: every part state", () => {
  const states = (out) => out.parts.map((p) => p.state).join(",");
  const { body, payload } = record();
  let out = c.openPayload(body, payload);
  assert.equal(states(out), "matches,matches,matches,matches");
  assert.equal(out.ok, true);

  // A payload part that does not open its commitment: tampered.
  out = c.openPayload(body, { ...payload, args: { content: "pin 4712", path: "pin.txt" } });
  assert.equal(out.parts[0].state, "mismatch");
  assert.equal(out.tampered, true);
  // The wrong salt opens nothing.
  out = c.openPayload(body, { ...payload, salt: "ff".repeat(32) });
  assert.equal(states(out), "mismatch,mismatch,mismatch,mismatch");

  // Erased: no payload, an erasure record names it; never tampered.
  out = c.openPayload(body, null, { erased: true });
  assert.equal(states(out), "erased,erased,erased,erased");
  assert.equal(out.ok, true);
  // Gone without an erasure record: tampered.
  out = c.openPayload(body, { salt: payload.salt, args: payload.args }, {});
  assert.equal(states(out), "matches,missing,missing,missing");
  assert.equal(out.tampered, true);
  // commitments_only keeps nothing, not even the salt; a record written
  // before the kernel stopped keeping the salt has it alone.
  for (const p of [null, { salt: payload.salt }]) {
    out = c.openPayload({ ...body, payload_depth: "commitments_only" }, p);
    assert.equal(states(out), "not_kept,not_kept,not_kept,not_kept");
    assert.equal(out.ok, true);
  }
  // Another agent's record read by an approver.
  out = c.openPayload(body, null, { withheld: true });
  assert.equal(states(out), "withheld,withheld,withheld,withheld");
  // A call without a policy input or context.
  const noCtx = { ...body };
  delete noCtx.context_commitment;
  out = c.openPayload(noCtx, { ...payload, context: undefined });
  assert.equal(out.parts[3].state, "absent");
  // A part the record never committed to.
  out = c.openPayload(noCtx, payload);
  assert.equal(out.parts[3].state, "mismatch");
});

test("payloadState: what the record view says of each record", () => {
  const { body, payload } = record();
  const only = { ...body, payload_depth: "commitments_only" };
  const erasure = { seq: 9, kind: "erasure", body: { seqs: [3], by: "admin", reason: "r" } };
  const cases = [
    // [name, record, state, message]
    ["kept", { entry: { body, payload }, full: true }, "kept", /^Kept beside the chain/],
    ["erased", { entry: { body }, full: true, erasure }, "erased", /^Erased/],
    ["erased, read by an approver", { entry: { body }, full: false, erasure }, "erased", /^Erased/],
    ["withheld", { entry: { body }, full: false }, "withheld", /^Withheld/],
    // The kernel stores no payload at commitments_only: not tampering.
    ["commitments_only", { entry: { body: only }, full: true }, "not_kept", /^Commitments only: nothing is kept, not even the salt/],
    ["commitments_only, read by an approver", { entry: { body: only }, full: false }, "withheld", /^Withheld/],
    // The kernel serves none of an older kernel's salt-only payload; a
    // payload at that depth says nothing more.
    ["commitments_only with a payload", { entry: { body: only, payload: { salt: payload.salt } }, full: true }, "not_kept",
      /^Commitments only: nothing is kept, not even the salt/],
    ["missing", { entry: { body }, full: true }, "missing", /^No payload kept, and no erasure record names this record/],
    ["before commitments", { entry: { body: { args_hash: "sha256:00" } }, full: true }, "none", /predates commitments/],
  ];
  for (const [name, rec, state, message] of cases) {
    const got = c.payloadState(rec);
    assert.equal(got.state, state, name);
    assert.match(got.message, message, name);
  }
});
