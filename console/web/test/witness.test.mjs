// The Ledger view's witness (src/witness.js) against checkpoints signed
// here with the key of ledger/testdata/merkle_vectors.json over that
// file's roots and consistency proofs: each case of `kernelctl ledger
// checkpoint` (cmd/kernelctl/checkpointstate.go). Run: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as v from "../src/verify.js";
import { witness, STATE, LEGACY } from "../src/witness.js";

const vec = JSON.parse(readFileSync(new URL("../../../ledger/testdata/merkle_vectors.json", import.meta.url), "utf8"));
const ORIGIN = vec.checkpoint.key_name;

// store is an in-memory localStorage.
function store(items = {}) {
  const m = new Map(Object.entries(items));
  return {
    getItem: (k) => (m.has(k) ? m.get(k) : null),
    setItem: (k, val) => m.set(k, String(val)),
    removeItem: (k) => m.delete(k),
    has: (k) => m.has(k),
  };
}

// signer returns a key of seed (hex) with its JWKS entry and a sign(origin,
// size, root bytes) making a C2SP signed note.
async function signer(seedHex) {
  const pkcs8 = v.unhex("302e020100300506032b657004220420" + seedHex);
  const priv = await crypto.subtle.importKey("pkcs8", pkcs8, { name: "Ed25519" }, true, ["sign"]);
  const jwk = await crypto.subtle.exportKey("jwk", priv);
  const pub = v.b64urlDecode(jwk.x);
  const kid = await v.thumbprint(pub);
  return {
    kid,
    jwk: { kty: "OKP", crv: "Ed25519", x: jwk.x, kid },
    async sign(origin, size, root) {
      const text = `${origin}\n${size}\n${btoa(String.fromCharCode(...root))}\n`;
      const sig = new Uint8Array(await crypto.subtle.sign("Ed25519", priv, new TextEncoder().encode(text)));
      const id = await v.noteKeyID(origin, pub);
      const line = btoa(String.fromCharCode(...id, ...sig));
      return `${text}\n\u2014 ${origin} ${line}\n`;
    },
  };
}

const root = (size) => v.unhex(vec.roots.find((r) => r.size === size).root.slice(7));
const other = new Uint8Array(32).fill(7);

// prove answers from the vectors' consistency proofs, and throws for a
// pair they do not hold (a kernel that proves no such extension).
async function prove(from, to) {
  const p = vec.consistency_proofs.find((c) => c.size1 === from && c.size2 === to);
  if (!p) throw new Error(`no consistency proof from ${from} to ${to}`);
  return p.proof.map((h) => v.unhex(h.slice(7)));
}

const kernelKey = await signer(vec.checkpoint.key_seed);
const otherKey = await signer("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb");
const jwks = { keys: [kernelKey.jwk] };

const verdict = (out) => out.checks[1][1];

test("a key's checkpoints: first seen, extended, same, older, forked, rewritten", async () => {
  const s = store();
  const run = async (size, r) => witness(await kernelKey.sign(ORIGIN, size, r), jwks, s, prove);
  const remembered = () => JSON.parse(s.getItem(STATE)).keys[kernelKey.kid];

  let out = await run(8, root(8));
  assert.equal(out.checks[0][1], true);
  assert.equal(verdict(out), null, "first seen");
  assert.ok(out.remembered);
  assert.equal(remembered().origin, ORIGIN);

  out = await run(17, root(17));
  assert.equal(verdict(out), true, out.checks[1][2]);
  assert.match(out.checks[1][2], /size 8 → 17/);
  assert.ok(remembered().note.includes("\n17\n"));

  out = await run(17, root(17));
  assert.equal(verdict(out), true, "the same checkpoint");

  out = await run(13, root(13));
  assert.equal(verdict(out), true, out.checks[1][2]);
  assert.match(out.checks[1][2], /older/);
  assert.equal(out.remembered, false);
  assert.ok(remembered().note.includes("\n17\n"), "an older checkpoint replaced the newer one");

  out = await run(17, other);
  assert.equal(verdict(out), false);
  assert.match(out.checks[1][2], /^FORK/);

  out = await run(16, other); // older, and no prefix of 17
  assert.equal(verdict(out), false);
  out = await run(2, root(2)); // older, and no proof from 2 to 17 in the vectors: the kernel proves none
  assert.equal(verdict(out), false);
  assert.ok(remembered().note.includes("\n17\n"), "a refused checkpoint was remembered");
});

test("a key signing under a new origin is refused: ORIGIN CHANGED, and the old one stays remembered", async () => {
  const s = store();
  await witness(await kernelKey.sign(ORIGIN, 17, root(17)), jwks, s, prove);
  // Another, shorter history under a new name, signed by the same key
  // (rev-console #5: the page skipped the check and remembered it).
  const out = await witness(await kernelKey.sign("capkernel.test/forged", 2, other), jwks, s, prove);
  assert.equal(out.checks[0][1], true, "the signature itself verifies");
  assert.equal(verdict(out), false);
  assert.match(out.checks[1][2], /^ORIGIN CHANGED: key \S+ signed the checkpoint of origin "capkernel.test\/ledger" \(size 17\)/);
  assert.equal(out.remembered, false);
  const st = JSON.parse(s.getItem(STATE));
  assert.equal(st.keys[kernelKey.kid].origin, ORIGIN);
  // And again: it never becomes the remembered history.
  assert.equal(verdict(await witness(await kernelKey.sign("capkernel.test/forged", 3, other), jwks, s, prove)), false);
});

test("an origin remembered under another key is refused: KEY CHANGED", async () => {
  const s = store();
  await witness(await kernelKey.sign(ORIGIN, 8, root(8)), jwks, s, prove);
  const out = await witness(await otherKey.sign(ORIGIN, 2, other), { keys: [otherKey.jwk] }, s, prove);
  assert.equal(verdict(out), false);
  assert.match(out.checks[1][2], /^KEY CHANGED/);
});

test("the key is the one the signature names, not the JWKS's first", async () => {
  const note = await kernelKey.sign(ORIGIN, 8, root(8));
  const out = await witness(note, { keys: [otherKey.jwk, kernelKey.jwk] }, store(), prove);
  assert.equal(out.kid, kernelKey.kid);
  assert.equal(out.checks[0][1], true);
  await assert.rejects(witness(note, { keys: [otherKey.jwk] }, store(), prove), /no key of the JWKS signs the checkpoint/);
  // A signature line naming the key whose signature is wrong fails.
  const forged = note.replace(/ (\S+)\n$/, (_, b) => " " + b.slice(0, 10) + (b[10] === "A" ? "B" : "A") + b.slice(11) + "\n");
  await assert.rejects(witness(forged, jwks, store(), prove), /does not verify/);
});

test("the note earlier versions remembered stands for its key", async () => {
  const s = store({ [LEGACY]: await kernelKey.sign(ORIGIN, 8, root(8)) });
  let out = await witness(await kernelKey.sign("capkernel.test/forged", 2, other), jwks, s, prove);
  assert.match(out.checks[1][2], /^ORIGIN CHANGED/);
  assert.ok(s.has(LEGACY));
  out = await witness(await kernelKey.sign(ORIGIN, 17, root(17)), jwks, s, prove);
  assert.equal(verdict(out), true, out.checks[1][2]);
  assert.equal(s.has(LEGACY), false, "the legacy note is replaced by the key's record");
  // Another key's legacy note of another origin says nothing about this
  // key, and stays.
  const t = store({ [LEGACY]: await otherKey.sign("elsewhere", 2, other) });
  assert.equal(verdict(await witness(await kernelKey.sign(ORIGIN, 8, root(8)), jwks, t, prove)), null);
  assert.ok(t.has(LEGACY), "another key's legacy note is kept");
  // Another key's legacy note of this origin refuses this key's
  // checkpoint (KEY CHANGED), as a record of that key would, and stays
  // (rev-key #5: it was taken for no record, then deleted).
  const u = store({ [LEGACY]: await otherKey.sign(ORIGIN, 17, root(17)) });
  out = await witness(await kernelKey.sign(ORIGIN, 8, other), { keys: [otherKey.jwk, kernelKey.jwk] }, u, prove);
  assert.match(out.checks[1][2], /^KEY CHANGED/);
  assert.equal(out.remembered, false);
  assert.ok(u.has(LEGACY), "the legacy note of the key that signed the origin is kept");
});
