// The console's verifier (src/verify.js) against the repository's golden
// vectors: RFC 8785 (jcs/testdata), call hashes (kernel/testdata), ledger
// entries and the Merkle tree, proofs and checkpoint (ledger/testdata),
// and the receipt JWS (receipts/testdata). Run: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import * as v from "../src/verify.js";

const root = new URL("../../../", import.meta.url);
const read = (p) => readFileSync(new URL(p, root), "utf8");
const json = (p) => JSON.parse(read(p));

test("RFC 8785 objects", () => {
  const lines = read("jcs/testdata/objects.txt").split("\n").filter((l) => l && !l.startsWith("#"));
  assert.ok(lines.length >= 2 && lines.length % 2 === 0);
  for (let i = 0; i < lines.length; i += 2) {
    assert.equal(v.canonicalize(JSON.parse(lines[i])), lines[i + 1], lines[i]);
  }
});

test("RFC 8785 numbers", () => {
  let n = 0;
  for (const l of read("jcs/testdata/numbers.txt").split("\n")) {
    if (!l || l.startsWith("#")) continue;
    const [bits, want] = l.split(/\s+/);
    const x = new DataView(new ArrayBuffer(8));
    x.setBigUint64(0, BigInt("0x" + bits));
    const f = x.getFloat64(0);
    if (want === "error") assert.throws(() => v.canonicalize(f), bits);
    else assert.equal(v.canonicalize(f), want, bits);
    n++;
  }
  assert.ok(n > 10);
});

test("call hashes", () => {
  for (const c of json("kernel/testdata/hashes.json")) {
    const obj = c.hashed === "args" ? c.args : JSON.parse(c.canonical);
    assert.equal(v.canonicalize(obj), c.canonical, c.name);
    assert.equal(v.digest(new TextEncoder().encode(c.canonical)), c.hash, c.name);
  }
});

test("ledger keys and entries", () => {
  const d = json("ledger/testdata/vectors.json");
  assert.equal(v.keys.leaf, d.leaf_key);
  assert.equal(v.keys.node, d.node_key);
  for (const e of d.entries) {
    const got = v.parseEntry(e.record);
    assert.equal(got.entry_hash, e.entry_hash, "entry " + e.seq);
  }
});

test("Merkle roots, inclusion and consistency proofs", () => {
  const d = json("ledger/testdata/merkle_vectors.json");
  assert.equal("blake3:" + v.hex(v.emptyRoot()), d.empty_root);
  const leaves = d.entries.map((e) => v.unhex(v.parseEntry(e.record).entry_hash.slice(7)));
  const mth = (ls) => {
    if (ls.length === 0) return v.emptyRoot();
    if (ls.length === 1) return ls[0];
    let k = 1;
    while (k * 2 < ls.length) k *= 2;
    return v.nodeHash(mth(ls.slice(0, k)), mth(ls.slice(k)));
  };
  const roots = {};
  for (const r of d.roots) {
    assert.equal("blake3:" + v.hex(mth(leaves.slice(0, r.size))), r.root, "root of size " + r.size);
    roots[r.size] = v.unhex(r.root.slice(7));
  }
  const h = (s) => v.unhex(s.slice(7));
  for (const p of d.inclusion_proofs) {
    const got = v.rootFromInclusion(p.index, p.size, leaves[p.index], p.proof.map(h));
    assert.deepEqual(got, roots[p.size], `inclusion ${p.index} in ${p.size}`);
    if (p.proof.length > 0) {
      const bad = p.proof.map(h);
      bad[0] = bad[0].map((x, i) => (i === 0 ? x ^ 1 : x));
      assert.notDeepEqual(v.rootFromInclusion(p.index, p.size, leaves[p.index], bad), roots[p.size]);
    }
  }
  for (const p of d.consistency_proofs) {
    v.verifyConsistency(p.size1, p.size2, roots[p.size1], roots[p.size2], p.proof.map(h));
    if (p.size1 > 0 && p.size1 < p.size2) {
      assert.throws(() => v.verifyConsistency(p.size1, p.size2, roots[p.size1 - 1] ?? roots[p.size1], roots[p.size2].map((x) => x ^ 1), p.proof.map(h)));
    }
  }
});

test("checkpoint signature", async () => {
  const c = json("ledger/testdata/merkle_vectors.json").checkpoint;
  const cp = await v.verifyCheckpoint(c.signed, v.unhex(c.public_key));
  assert.equal(cp.origin, c.key_name);
  assert.equal(cp.size, 17);
  assert.equal(cp.text, c.text);
  const tampered = c.signed.replace("\n17\n", "\n16\n");
  await assert.rejects(v.verifyCheckpoint(tampered, v.unhex(c.public_key)), /does not verify/);
  // The same signature bytes spelled with an unused trailing bit set:
  // refused, as ledger.OpenCheckpoint refuses it.
  const respelled = c.signed.replace(/([A-Za-z0-9+/])(=*)\n$/, (_, ch, pad) => flipLowBit(ch) + pad + "\n");
  assert.notEqual(respelled, c.signed);
  await assert.rejects(v.verifyCheckpoint(respelled, v.unhex(c.public_key)), /not canonical base64/);
});

// flipLowBit returns the base64 digit after ch with its lowest bit flipped:
// in a last digit that carries unused bits, the same bytes.
function flipLowBit(ch) {
  const std = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const url = std.slice(0, 62) + "-_";
  const alpha = ch === "-" || ch === "_" ? url : std;
  return alpha[alpha.indexOf(ch) ^ 1];
}

test("receipt JWS", async () => {
  const jws = read("receipts/testdata/receipt.jws").trim();
  const jwks = json("receipts/testdata/jwks.json");
  const { receipt } = await v.verifyReceipt(jws, jwks);
  assert.deepEqual(receipt, json("receipts/testdata/receipt.json"));
  const [h, p, s] = jws.split(".");
  const sig = v.b64urlDecode(s);
  sig[0] ^= 1;
  await assert.rejects(v.verifyReceipt([h, p, v.b64urlEncode(sig)].join("."), jwks), /signature does not verify/);
  // A key whose kid is not its thumbprint: the JWKS is refused.
  const other = { keys: [{ ...jwks.keys[0], kid: "x" }] };
  await assert.rejects(v.verifyReceipt(jws, other), /not the key's thumbprint/);
  // A kid the JWKS has no Ed25519 key for.
  const es256 = { kty: "EC", crv: "P-256", kid: "es", x: "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", y: "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0" };
  await assert.rejects(v.verifyReceipt(jws.replace(/^[^.]+/, v.b64urlEncode(new TextEncoder().encode('{"alg":"EdDSA","kid":"es","typ":"capkernel-receipt+jws"}'))), { keys: [...jwks.keys, es256] }), /no key es/);
  // A 64-byte signature ends in a digit with four unused bits: the same
  // bytes respelled are refused, as the Go verifier refuses them.
  const respelled = [h, p, s.slice(0, -1) + flipLowBit(s.slice(-1))].join(".");
  await assert.rejects(v.verifyReceipt(respelled, jwks), /not canonical base64url/);
});

test("receipt proven by the log (v2)", async () => {
  const receipt = json("receipts/testdata/logged.json");
  const jwks = json("receipts/testdata/jwks.json");
  const ok = await v.verifyBundle(receipt, jwks);
  assert.equal(ok.ok, true, JSON.stringify(ok.checks));
  assert.equal(ok.format, v.RECEIPT_FORMAT);
  assert.deepEqual(ok.checks.map((c) => c.id), ["entry", "checkpoint", "inclusion"]);
  const e = v.parseEntry(receipt.entry);
  assert.match(ok.checks[0].detail, new RegExp(v.receiptID(e.seq, e.entry_hash)));
  const failing = async (edit, id) => {
    const r = structuredClone(receipt);
    edit(r);
    const out = await v.verifyBundle(r, jwks);
    assert.equal(out.ok, false);
    assert.equal(out.checks.find((c) => c.ok === false).id, id);
  };
  await failing((r) => (r.entry = r.entry.replace('"echo"', '"fs.rm"')), "entry");
  await failing((r) => (r.extra = 1), "entry");
  await failing((r) => (r.checkpoint = r.checkpoint.replace("\n5\n", "\n6\n")), "checkpoint");
  await failing((r) => (r.inclusion.proof[0] = r.inclusion.leaf_hash), "inclusion");
  await failing((r) => (r.inclusion.tree_size = 4), "inclusion");
  const other = { keys: [{ ...jwks.keys[0], x: v.b64urlEncode(new Uint8Array(32).fill(7)) }] };
  const out = await v.verifyBundle(receipt, other);
  assert.equal(out.checks.find((c) => c.id === "checkpoint").ok, false);
});

// The vectors both verifiers rule on (receipts/testdata/verify_vectors.json,
// which receipts.TestVerifyVectors checks against VerifyLogged): each
// receipt's bytes and its JWKS's text go in as they are, so the console
// parses them as a page given the files would.
test("verify vectors shared with the Go verifier", async () => {
  const d = json("receipts/testdata/verify_vectors.json");
  assert.ok(d.cases.length >= 50);
  const failures = [];
  for (const c of d.cases) {
    const bytes = c.receipt_base64 !== undefined ? Buffer.from(c.receipt_base64, "base64") : new TextEncoder().encode(c.receipt);
    const jwks = d.jwks[c.jwks];
    assert.equal(typeof jwks, "string", c.name);
    const out = await v.verifyBundle(new Uint8Array(bytes), jwks);
    if (out.ok !== c.ok) failures.push(c.name + " (" + c.rule + "): " + JSON.stringify(out.checks.filter((x) => x.ok === false)));
  }
  assert.deepEqual(failures, [], "cases ruled on otherwise than the Go verifier does");
});
