// The console's receipt verifier: an independent implementation of
// docs/formats.md ("Receipts"), written from the spec, not from the Go
// code. A receipt proven by the log (capkernel-receipt/v2, what every call
// gets) is checked in order, each check reported by name so a page can
// show which one failed:
//
//   entry      the audit entry is canonical, well formed, of kind audit,
//              and its entry_hash recomputes (keyed BLAKE3);
//   checkpoint the C2SP signed note carries a valid Ed25519 signature, under
//              a key name equal to its origin, by a key of the JWKS (whose
//              kid is its RFC 7638 thumbprint);
//   inclusion  the RFC 9162 inclusion proof of the entry leads to the
//              checkpoint's root.
//
// Bundles of format v1 (capkernel-receipt-bundle/v1: a JWS receipt, its
// entry, a checkpoint and a proof) from kernels that signed every receipt
// are still checked: jws, entry, agreement, checkpoint, inclusion.
//
// This module is the one place that knows the receipt format: swap it
// when the format changes.

import { blake3 } from "@noble/hashes/blake3.js";

export const RECEIPT_FORMAT = "capkernel-receipt/v2";
export const BUNDLE_FORMAT = "capkernel-receipt-bundle/v1";

const enc = new TextEncoder();

// ---- RFC 8785 (JCS) ----

// canonicalize returns the RFC 8785 canonical JSON of a value parsed by
// JSON.parse (so numbers are IEEE doubles, as RFC 8785 requires).
export function canonicalize(v) {
  if (v === null || typeof v === "boolean") return JSON.stringify(v);
  if (typeof v === "number") {
    if (!Number.isFinite(v)) throw new Error("JCS: a number that is not finite");
    return JSON.stringify(v); // ECMAScript Number serialization, as RFC 8785 §3.2.2.3 specifies
  }
  if (typeof v === "string") return JSON.stringify(v); // RFC 8785 §3.2.2.2 is JSON.stringify's escaping
  if (Array.isArray(v)) return "[" + v.map(canonicalize).join(",") + "]";
  if (typeof v === "object") {
    // Keys sorted by UTF-16 code units: JavaScript's default sort order.
    const keys = Object.keys(v).sort();
    return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonicalize(v[k])).join(",") + "}";
  }
  throw new Error("JCS: cannot serialize a " + typeof v);
}

// ---- strict JSON (the rules of the Go verifier's strictjson) ----

// MAX_DEPTH is the deepest nesting a document may have (arrays and
// objects), as encoding/json/v2 allows.
export const MAX_DEPTH = 10000;

const NUMBER = /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/y;
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

// parseStrict parses input (a string, or UTF-8 bytes: a Uint8Array or an
// ArrayBuffer) as exactly one JSON value that every reader reads alike, or
// throws: valid UTF-8 (bytes are decoded strictly, a BOM is not white
// space), no \u escape of a lone surrogate, no duplicate member name in
// any object (compared after unescaping), nesting at most maxDepth deep,
// nothing but white space around the value. JSON.parse keeps the last of
// two members of one name where other readers keep the first or refuse.
// With plainIntegers, every number must be a non-negative integer written
// in plain digits (what a Go uint64 field takes: no sign, fraction or
// exponent).
export function parseStrict(input, { maxDepth = MAX_DEPTH, plainIntegers = false } = {}) {
  let text = input;
  if (typeof input !== "string") {
    try {
      text = utf8.decode(input);
    } catch {
      throw new Error("JSON: not UTF-8");
    }
  }
  if (!text.isWellFormed()) throw new Error("JSON: a lone surrogate (not UTF-8)");
  let i = 0;
  const fail = (what) => {
    throw new Error("JSON: " + what + " at offset " + i);
  };
  const ws = () => {
    while (i < text.length && (text[i] === " " || text[i] === "\t" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  const str = () => {
    i++; // "
    let out = "";
    for (;;) {
      const j = i;
      while (i < text.length && text[i] !== '"' && text[i] !== "\\" && text.charCodeAt(i) >= 0x20) i++;
      out += text.slice(j, i);
      if (i >= text.length) fail("unterminated string");
      const c = text[i];
      if (c === '"') {
        i++;
        return out;
      }
      if (c !== "\\") fail("control character in a string");
      const e = text[i + 1];
      const short = { '"': '"', "\\": "\\", "/": "/", b: "\b", f: "\f", n: "\n", r: "\r", t: "\t" }[e];
      if (short !== undefined) {
        out += short;
        i += 2;
        continue;
      }
      if (e !== "u") fail("bad escape");
      const unit = (at) => (/^[0-9a-fA-F]{4}$/.test(text.slice(at, at + 4)) ? parseInt(text.slice(at, at + 4), 16) : fail("bad \\u escape"));
      const u = unit(i + 2);
      i += 6;
      if (u >= 0xdc00 && u <= 0xdfff) fail("\\u escape of a lone surrogate");
      if (u >= 0xd800 && u <= 0xdbff) {
        const lo = text.slice(i, i + 2) === "\\u" ? unit(i + 2) : -1;
        if (lo < 0xdc00 || lo > 0xdfff) fail("\\u escape of a lone surrogate");
        out += String.fromCharCode(u, lo);
        i += 6;
        continue;
      }
      out += String.fromCharCode(u);
    }
  };
  // scalar reads a string, number or literal at i.
  const scalar = () => {
    const c = text[i];
    if (c === '"') return str();
    NUMBER.lastIndex = i;
    const m = NUMBER.exec(text);
    if (m) {
      if (plainIntegers && (m[2] || m[3] || c === "-")) fail("number " + m[0] + " is not a non-negative integer in plain digits");
      i += m[0].length;
      return Number(m[0]);
    }
    for (const [lit, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(lit, i)) {
        i += lit.length;
        return v;
      }
    }
    return fail("invalid character " + JSON.stringify(c ?? "end of input"));
  };
  // value parses one value with an explicit stack of the open arrays and
  // objects (recursion would run out of stack before maxDepth).
  const value = () => {
    const stack = []; // {out, names, name} per open container
    let done;
    // put adds v to the innermost open container, or ends the parse.
    const put = (v) => {
      const top = stack.at(-1);
      if (!top) done = { v };
      else if (Array.isArray(top.out)) top.out.push(v);
      // defineProperty: a member "__proto__" is data, not the prototype.
      else Object.defineProperty(top.out, top.name, { value: v, writable: true, enumerable: true, configurable: true });
    };
    // member reads an object's next member name and its colon.
    const member = (top) => {
      ws();
      if (text[i] !== '"') fail("expected a member name");
      const name = str();
      if (top.names.has(name)) fail("duplicate member name " + JSON.stringify(name));
      top.names.add(name);
      top.name = name;
      ws();
      if (text[i] !== ":") fail("expected :");
      i++;
    };
    for (;;) {
      // A value starts here.
      ws();
      const c = text[i];
      if (c === "{" || c === "[") {
        if (stack.length >= maxDepth) fail("nesting deeper than " + maxDepth);
        i++;
        ws();
        const top = { out: c === "{" ? {} : [], names: new Set(), close: c === "{" ? "}" : "]" };
        if (text[i] !== top.close) {
          stack.push(top);
          if (c === "{") member(top);
          continue;
        }
        i++;
        put(top.out);
      } else {
        put(scalar());
      }
      // After a value: close containers, or move on to the next element.
      for (;;) {
        if (done) return done.v;
        const top = stack.at(-1);
        ws();
        if (text[i] === ",") {
          i++;
          if (!Array.isArray(top.out)) member(top);
          break;
        }
        if (text[i] !== top.close) fail("expected , or " + top.close);
        i++;
        stack.pop();
        put(top.out);
      }
    }
  };
  const v = value();
  ws();
  if (i !== text.length) fail("data after the JSON value");
  return v;
}

// ---- encodings ----

export function hex(b) {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

export function unhex(s) {
  if (!/^([0-9a-f]{2})*$/.test(s)) throw new Error("not lowercase hex: " + s.slice(0, 20));
  const out = new Uint8Array(s.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(s.slice(2 * i, 2 * i + 2), 16);
  return out;
}

function b64decode(s) {
  const bin = atob(s);
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

function b64encode(b) {
  return btoa(String.fromCharCode(...b));
}

// b64urlDecode decodes unpadded base64url, refusing any spelling but the
// canonical one (unused trailing bits set), as the Go verifier does: one
// signature must not have many texts.
export function b64urlDecode(s) {
  if (!/^[A-Za-z0-9_-]*$/.test(s)) throw new Error("not base64url without padding");
  const t = s.replace(/-/g, "+").replace(/_/g, "/");
  const b = b64decode(t + "===".slice((t.length + 3) % 4));
  if (b64urlEncode(b) !== s) throw new Error("not canonical base64url");
  return b;
}

export function b64urlEncode(b) {
  return b64encode(b).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function concat(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}

function equalBytes(a, b) {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

// ---- hashes ----

const LEAF_KEY = blake3(new Uint8Array(0), { context: enc.encode("capkernel ledger v1 leaf") });
const NODE_KEY = blake3(new Uint8Array(0), { context: enc.encode("capkernel ledger v1 node") });

export const keys = { leaf: hex(LEAF_KEY), node: hex(NODE_KEY) };

// digest is plain BLAKE3-256 as "blake3:<hex>" (args_hash, result_hash).
export function digest(bytes) {
  return "blake3:" + hex(blake3(bytes));
}

export function nodeHash(left, right) {
  return blake3(concat(left, right), { key: NODE_KEY });
}

export function emptyRoot() {
  return blake3(new Uint8Array(0), { key: NODE_KEY });
}

function parseHash(s, what) {
  if (typeof s !== "string" || !/^blake3:[0-9a-f]{64}$/.test(s)) throw new Error(what + " is not blake3:<64 hex>");
  return unhex(s.slice(7));
}

// ---- ledger entries ----

// BODY_DEPTH is the deepest nesting of an entry's body that the Go
// verifier's canonical check (jcs.MaxDepth) takes.
const BODY_DEPTH = 1000;

// validTime reports whether t (of the form of a record's time) names a
// real instant: month, day of that month (proleptic Gregorian, as Go's
// time package), hour, minute and second in range.
function validTime(t) {
  const [y, mo, d, h, mi, s] = [t.slice(0, 4), t.slice(5, 7), t.slice(8, 10), t.slice(11, 13), t.slice(14, 16), t.slice(17, 19)].map(Number);
  const leap = y % 4 === 0 && (y % 100 !== 0 || y % 400 === 0);
  const days = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][mo - 1];
  return mo >= 1 && mo <= 12 && d >= 1 && d <= days && h <= 23 && mi <= 59 && s <= 59;
}

// parseEntry checks a ledger record (its exact canonical bytes) and
// returns the entry with its recomputed hash.
export function parseEntry(record) {
  if (typeof record !== "string") throw new Error("the record is not a string");
  // Strictly: JSON.parse takes \ud800, which canonicalizes to itself.
  const e = parseStrict(record, { maxDepth: BODY_DEPTH + 1 });
  if (canonicalize(e) !== record) throw new Error("the record is not canonical JSON");
  const fields = ["body", "entry_hash", "kind", "prev_hash", "seq", "time"];
  const got = Object.keys(e).sort();
  if (got.join() !== fields.join()) throw new Error("record fields are " + got.join(",") + ", want " + fields.join(","));
  if (!Number.isSafeInteger(e.seq) || e.seq < 0) throw new Error("seq is not a non-negative integer below 2^53");
  if (typeof e.kind !== "string" || !/^[a-z][a-z0-9_]*$/.test(e.kind) || e.kind.length > 64) throw new Error("kind is malformed");
  if (typeof e.time !== "string" || !/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$/.test(e.time) || !validTime(e.time)) throw new Error("time is not a valid RFC 3339 UTC time with nine fractional digits");
  parseHash(e.prev_hash, "prev_hash");
  if (e.body === null || typeof e.body !== "object" || Array.isArray(e.body)) throw new Error("body is not an object");
  const pre = canonicalize({ body: e.body, kind: e.kind, prev_hash: e.prev_hash, seq: e.seq, time: e.time });
  const h = "blake3:" + hex(blake3(enc.encode(pre), { key: LEAF_KEY }));
  if (h !== e.entry_hash) throw new Error("entry_hash " + e.entry_hash + " does not recompute (" + h + ")");
  return e;
}

// ---- Merkle proofs (RFC 9162 §2.1.3.2) ----

// rootFromInclusion computes the root an inclusion proof leads to.
export function rootFromInclusion(index, size, leaf, proof) {
  if (!(index < size)) throw new Error("leaf index " + index + " is not below tree size " + size);
  let fn = index, sn = size - 1, r = leaf;
  for (const p of proof) {
    if (sn === 0) throw new Error("the proof is longer than the path");
    if (fn % 2 === 1 || fn === sn) {
      r = nodeHash(p, r);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      }
    } else {
      r = nodeHash(r, p);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("the proof is shorter than the path");
  return r;
}

// verifyConsistency checks an RFC 9162 §2.1.4.2 consistency proof from
// (size1, root1) to (size2, root2); it throws when it does not hold.
export function verifyConsistency(size1, size2, root1, root2, proof) {
  if (size1 > size2) throw new Error("size1 is above size2");
  if (size1 === size2) {
    if (proof.length !== 0 || !equalBytes(root1, root2)) throw new Error("equal sizes need an empty proof and equal roots");
    return;
  }
  if (size1 === 0) {
    if (proof.length !== 0 || !equalBytes(root1, emptyRoot())) throw new Error("from size 0 the proof is empty and the old root the empty root");
    return;
  }
  let p = proof;
  if ((size1 & (size1 - 1)) === 0) p = [root1, ...proof];
  if (p.length === 0) throw new Error("empty consistency proof");
  let fn = size1 - 1, sn = size2 - 1;
  while (fn % 2 === 1) {
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  let fr = p[0], sr = p[0];
  for (const c of p.slice(1)) {
    if (sn === 0) throw new Error("the consistency proof is too long");
    if (fn % 2 === 1 || fn === sn) {
      fr = nodeHash(c, fr);
      sr = nodeHash(c, sr);
      if (fn % 2 === 0) {
        while (fn % 2 === 0 && fn !== 0) {
          fn = Math.floor(fn / 2);
          sn = Math.floor(sn / 2);
        }
      }
    } else {
      sr = nodeHash(sr, c);
    }
    fn = Math.floor(fn / 2);
    sn = Math.floor(sn / 2);
  }
  if (sn !== 0) throw new Error("the consistency proof is too short");
  if (!equalBytes(fr, root1)) throw new Error("the proof does not lead to the old root");
  if (!equalBytes(sr, root2)) throw new Error("the proof does not lead to the new root");
}

// ---- checkpoints (C2SP tlog-checkpoint in a signed note) ----

// NOTE_SPACE is Go's unicode.IsSpace: the White_Space characters, which
// a note's key name may not hold (JavaScript's \s differs: it takes
// U+FEFF and not U+0085).
const NOTE_SPACE = /[\t\n\v\f\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]/;

// checkLine refuses a checkpoint line (origin, extension) that is empty or
// holds a control character.
function checkLine(what, l) {
  if (l === "") throw new Error(what + " is empty");
  if (/[\x00-\x1f\x7f]/.test(l)) throw new Error(what + " " + JSON.stringify(l.slice(0, 40)) + " holds a control character");
}

// parseCheckpoint splits a signed note into its checkpoint and signatures,
// by the rules of C2SP signed-note as golang.org/x/mod/sumdb/note applies
// them: no control character but newlines; the text ends at the last blank
// line; then one or more signature lines "— <name> <base64>", each ending
// in a newline, at most 100, the name without white space or "+", the
// base64 canonical and of at least 5 bytes. The checkpoint's lines are
// the origin, size and root, then extension lines, none empty.
export function parseCheckpoint(note) {
  if (typeof note !== "string") throw new Error("the checkpoint is not a string");
  if (/[\x00-\x09\x0b-\x1f]/.test(note)) throw new Error("the note holds a control character");
  const sep = note.lastIndexOf("\n\n");
  if (sep < 0) throw new Error("the note has no signature block");
  const text = note.slice(0, sep + 1);
  const block = note.slice(sep + 2);
  if (!block.endsWith("\n")) throw new Error("the signature block does not end with a newline");
  const lines = text.slice(0, -1).split("\n");
  if (lines.length < 3) throw new Error("the checkpoint has fewer than three lines");
  const [origin, sizeLine, rootLine] = lines;
  checkLine("the origin", origin);
  if (!/^(0|[1-9][0-9]*)$/.test(sizeLine)) throw new Error("bad size line " + JSON.stringify(sizeLine));
  const size = Number(sizeLine);
  if (!Number.isSafeInteger(size)) throw new Error("size is too large");
  const root = b64decode(rootLine);
  if (root.length !== 32 || b64encode(root) !== rootLine) throw new Error("bad root line");
  lines.slice(3).forEach((l, i) => checkLine("extension line " + (i + 1), l));
  const sigLines = block.slice(0, -1).split("\n");
  if (sigLines.length > 100) throw new Error("the note has more than 100 signatures");
  const sigs = [];
  for (const l of sigLines) {
    if (!l.startsWith("\u2014 ")) throw new Error("bad signature line " + JSON.stringify(l.slice(0, 40)));
    const rest = l.slice(2);
    const sp = rest.indexOf(" ");
    const name = sp < 0 ? rest : rest.slice(0, sp);
    const b64 = sp < 0 ? "" : rest.slice(sp + 1);
    if (name === "" || NOTE_SPACE.test(name) || name.includes("+")) throw new Error("bad signer name " + JSON.stringify(name.slice(0, 40)));
    if (!/^[A-Za-z0-9+/]+={0,2}$/.test(b64) || b64.length % 4 !== 0) throw new Error("the signature by " + name + " is not base64");
    const raw = b64decode(b64);
    if (b64encode(raw) !== b64) throw new Error("the signature by " + name + " is not canonical base64");
    if (raw.length < 5) throw new Error("short signature");
    sigs.push({ name, keyID: raw.slice(0, 4), sig: raw.slice(4) });
  }
  return { text, origin, size, root, sigs };
}

// noteKeyID is the key id of a C2SP signed note's Ed25519 key pub under
// the key name name: the first 4 bytes of SHA-256(name "\n" 0x01 pub).
export async function noteKeyID(name, pub) {
  const h = new Uint8Array(await crypto.subtle.digest("SHA-256", concat(enc.encode(name + "\n"), new Uint8Array([1]), pub)));
  return h.slice(0, 4);
}

// verifyCheckpoint checks that the note is signed by pub under a key name
// equal to its origin, ignoring other signers' lines (witnesses).
export async function verifyCheckpoint(note, pub) {
  const cp = parseCheckpoint(note);
  const id = await noteKeyID(cp.origin, pub);
  const key = await importEd25519(pub);
  for (const s of cp.sigs) {
    if (s.name !== cp.origin || !equalBytes(s.keyID, id)) continue;
    if (s.sig.length === 64 && (await crypto.subtle.verify("Ed25519", key, s.sig, enc.encode(cp.text)))) return cp;
    throw new Error("the signature of " + s.name + " does not verify");
  }
  throw new Error("no signature by the kernel's key under the origin " + cp.origin);
}

// ---- JWS receipts ----

const RECEIPT_REQUIRED = ["receipt_id", "operation_id", "tool_id", "agent_id", "capability_token_id", "args_hash",
  "result_hash", "tx_outcome", "policy_hash", "autonomy_mode", "risk_score", "ledger_seq", "ledger_entry_hash", "issued_at"];
const RECEIPT_OPTIONAL = ["commit_delta_id", "error_class", "approval_id", "approved_by", "approval_reason"];

function importEd25519(pub) {
  return crypto.subtle.importKey("raw", pub, { name: "Ed25519" }, false, ["verify"]);
}

// thumbprint is the RFC 7638 thumbprint of an Ed25519 public key.
export async function thumbprint(pub) {
  const j = canonicalize({ crv: "Ed25519", kty: "OKP", x: b64urlEncode(pub) });
  return b64urlEncode(new Uint8Array(await crypto.subtle.digest("SHA-256", enc.encode(j))));
}

// verifyReceipt checks a compact JWS receipt against a JWKS and returns
// its payload and the public key that verified it.
export async function verifyReceipt(jws, jwks) {
  if (typeof jws !== "string") throw new Error("the receipt is not a string");
  const parts = jws.split(".");
  if (parts.length !== 3) throw new Error("not a compact JWS (three parts)");
  const header = new TextDecoder("utf-8", { fatal: true }).decode(b64urlDecode(parts[0]));
  const h = JSON.parse(header);
  if (typeof h.kid !== "string") throw new Error("the header has no kid");
  const want = canonicalize({ alg: "EdDSA", kid: h.kid, typ: "capkernel-receipt+jws" });
  if (header !== want) throw new Error("the header is not exactly " + want);
  const key = (await jwksKeys(jwks)).find((k) => k.kid === h.kid);
  if (!key) throw new Error("no key " + h.kid + " in the JWKS as an Ed25519 signature key");
  const pub = key.pub;
  const sig = b64urlDecode(parts[2]);
  const ok = sig.length === 64 && (await crypto.subtle.verify("Ed25519", await importEd25519(pub), sig, enc.encode(parts[0] + "." + parts[1])));
  if (!ok) throw new Error("the Ed25519 signature does not verify");
  const payload = new TextDecoder("utf-8", { fatal: true }).decode(b64urlDecode(parts[1]));
  const r = JSON.parse(payload);
  if (canonicalize(r) !== payload) throw new Error("the payload is not canonical JSON");
  for (const f of RECEIPT_REQUIRED) if (!(f in r)) throw new Error("the receipt has no " + f);
  for (const f of Object.keys(r)) {
    if (!RECEIPT_REQUIRED.includes(f) && !RECEIPT_OPTIONAL.includes(f)) throw new Error("unknown receipt field " + f);
  }
  return { receipt: r, pub };
}

// checkSummary refuses an audit body whose members that a receipt's
// summary reads (the receipt fields: receipts.Summarize) are not of their
// type: strings, risk_score a number, ledger_seq an integer in [0, 2^64);
// null stands for none.
function checkSummary(body) {
  for (const f of [...RECEIPT_REQUIRED, ...RECEIPT_OPTIONAL]) {
    const x = body[f];
    if (!Object.hasOwn(body, f) || x === null) continue;
    const ok = f === "risk_score" ? typeof x === "number" : f === "ledger_seq" ? Number.isInteger(x) && x >= 0 && x < 2 ** 64 : typeof x === "string";
    if (!ok) throw new Error("the body's " + f + " is " + JSON.stringify(x) + ", not of its type");
  }
}

// The fields of a receipt its audit entry's body must agree with.
const AGREEING = ["operation_id", "tool_id", "agent_id", "capability_token_id", "args_hash", "result_hash",
  "tx_outcome", "commit_delta_id", "policy_hash", "autonomy_mode", "risk_score", "error_class"];

function isObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

// jwksKeys returns the Ed25519 signature keys of a JWKS ([{kid, pub}]) by
// the rule of docs/formats.md ("The kernel's JWKS"), which the Go verifier
// applies too: the JWKS (its text parsed strictly, or an object) has a
// "keys" array of objects; a key whose kty is not OKP, crv not Ed25519,
// or that has a use other than sig or an alg other than EdDSA is skipped
// (an ES256 key beside the kernel's, say); every other key must have x the
// canonical unpadded base64url of 32 bytes, kid its RFC 7638 thumbprint
// and no d (a private key), and no two may share a kid, or the JWKS is
// refused; and there must be at least one.
export async function jwksKeys(jwks) {
  if (isText(jwks)) jwks = parseStrict(jwks);
  if (!isObject(jwks) || !Array.isArray(jwks.keys)) throw new Error("the JWKS has no keys array");
  const out = [];
  for (const [i, k] of jwks.keys.entries()) {
    const n = "JWKS key " + (i + 1);
    if (!isObject(k)) throw new Error(n + " is not an object");
    if (k.kty !== "OKP" || k.crv !== "Ed25519" || (Object.hasOwn(k, "use") && k.use !== "sig") || (Object.hasOwn(k, "alg") && k.alg !== "EdDSA")) continue;
    if (Object.hasOwn(k, "d")) throw new Error(n + " holds a private key (d)");
    if (typeof k.x !== "string" || k.x === "") throw new Error(n + " has no x string");
    const pub = b64urlDecode(k.x);
    if (pub.length !== 32) throw new Error(n + ": x is " + pub.length + " bytes, want 32");
    const kid = await thumbprint(pub);
    if (k.kid !== kid) throw new Error(n + ": kid " + JSON.stringify(k.kid) + " is not the key's thumbprint " + kid);
    if (out.some((o) => o.kid === kid)) throw new Error("JWKS keys " + JSON.stringify(kid) + ": two Ed25519 keys have this kid");
    out.push({ kid, pub });
  }
  if (out.length === 0) throw new Error("the JWKS holds no Ed25519 signature key");
  return out;
}

// receiptID is the receipt id of the audit entry seq with hash h
// ("blake3:<hex>"): "r<seq>-<first 16 hex digits>".
export function receiptID(seq, h) {
  return "r" + seq + "-" + h.slice(7, 23);
}

const INCLUSION_FIELDS = ["leaf_hash", "leaf_index", "proof", "tree_size"];

// checkInclusion checks an inclusion proof of entry in the checkpoint cp.
function checkInclusion(inc, entry, cp) {
  // Exactly these members, none null: the Go verifier reads each into a
  // field of its own type (a missing or null one is not a zero).
  const got = isObject(inc) ? Object.keys(inc).sort() : [];
  if (got.join() !== INCLUSION_FIELDS.join()) throw new Error("inclusion members are " + got.join(",") + ", want " + INCLUSION_FIELDS.join(","));
  if (inc.leaf_index !== entry.seq) throw new Error("leaf_index " + inc.leaf_index + " is not the entry's seq " + entry.seq);
  if (inc.leaf_hash !== entry.entry_hash) throw new Error("leaf_hash is not the entry's hash");
  if (inc.tree_size !== cp.size) throw new Error("tree_size " + inc.tree_size + " is not the checkpoint's size " + cp.size);
  if (!Array.isArray(inc.proof)) throw new Error("proof is not a list");
  const root = rootFromInclusion(inc.leaf_index, inc.tree_size, parseHash(inc.leaf_hash, "leaf_hash"), inc.proof.map((p) => parseHash(p, "a proof hash")));
  if (!equalBytes(root, cp.root)) throw new Error("the proof leads to " + hex(root) + ", not the checkpoint's root " + hex(cp.root));
  return "leaf " + inc.leaf_index + " of " + inc.tree_size + ", " + inc.proof.length + " hashes";
}

// ---- receipts proven by the log (v2) ----

// CHECKS_V2 names the checks of a receipt proven by the log, in order.
export const CHECKS_V2 = [
  ["entry", "Audit entry well formed, canonical, entry_hash recomputes (BLAKE3)"],
  ["checkpoint", "Checkpoint signed by a key of the kernel's JWKS (Ed25519)"],
  ["inclusion", "Inclusion proof leads to the checkpoint's root"],
];

const V2_FIELDS = ["checkpoint", "entry", "format", "inclusion"];

async function verifyLogged(receipt, jwks, run) {
  let entry, cp;
  const entryOK = await run("entry", async () => {
    const got = Object.keys(receipt).sort();
    if (got.join() !== V2_FIELDS.join()) throw new Error("receipt members are " + got.join(",") + ", want " + V2_FIELDS.join(","));
    if (typeof receipt.entry !== "string") throw new Error("entry is not a string");
    entry = parseEntry(receipt.entry);
    if (entry.kind !== "audit") throw new Error("the entry is of kind " + entry.kind + ", not audit");
    checkSummary(entry.body);
    return "receipt " + receiptID(entry.seq, entry.entry_hash) + ": " + entry.body.tool_id + " by " + entry.body.agent_id + ", seq " + entry.seq;
  });
  const cpOK = await run("checkpoint", async () => {
    if (typeof receipt.checkpoint !== "string") throw new Error("checkpoint is not a string");
    let last;
    for (const { pub } of await jwksKeys(jwks)) {
      try {
        cp = await verifyCheckpoint(receipt.checkpoint, pub);
        return cp.origin + " size " + cp.size + ", signed by " + (await thumbprint(pub));
      } catch (e) {
        last = e;
      }
    }
    throw last;
  });
  if (entryOK && cpOK) await run("inclusion", async () => checkInclusion(receipt.inclusion, entry, cp));
}

// ---- the bundle (v1) ----

// CHECKS names the checks of verifyBundle, in order, with what each means.
export const CHECKS = [
  ["jws", "Receipt signature (Ed25519, JWKS key, exact header and payload)"],
  ["entry", "Ledger entry well formed, canonical, entry_hash recomputes (BLAKE3)"],
  ["agreement", "Entry agrees with the receipt"],
  ["checkpoint", "Checkpoint signed by the kernel's key"],
  ["inclusion", "Inclusion proof leads to the checkpoint's root"],
];

// isText reports whether a document is given as its JSON text (a string
// or UTF-8 bytes) rather than as a value parsed already.
function isText(doc) {
  return typeof doc === "string" || doc instanceof Uint8Array || doc instanceof ArrayBuffer;
}

// verifyBundle runs every check on a receipt: one proven by the log
// (RECEIPT_FORMAT) or a v1 bundle (BUNDLE_FORMAT), with the kernel's JWKS.
// Each is given as its JSON text (a string or UTF-8 bytes), which is
// parsed strictly (parseStrict: a text with duplicate member names, for
// one, is refused as the Go verifier refuses it), or as a value parsed
// already, which the caller vouches for. It never throws: the result is
// {ok, format, checks: [{id, label, ok, detail}]}, and a check after a
// failed one it depends on is reported as skipped (ok null).
export async function verifyBundle(bundle, jwks) {
  if (isText(bundle)) {
    try {
      // Numbers in a receipt are uint64 fields (leaf_index, tree_size).
      bundle = parseStrict(bundle, { plainIntegers: true });
    } catch (e) {
      const checks = CHECKS_V2.map(([id, label]) => ({ id, label, ok: null, detail: "skipped: an earlier check failed" }));
      Object.assign(checks[0], { ok: false, detail: "the receipt: " + e.message });
      return { ok: false, format: undefined, checks };
    }
  }
  const v2 = bundle && bundle.format === RECEIPT_FORMAT;
  const checks = (v2 ? CHECKS_V2 : CHECKS).map(([id, label]) => ({ id, label, ok: null, detail: "skipped: an earlier check failed" }));
  const set = (id, ok, detail) => Object.assign(checks.find((c) => c.id === id), { ok, detail });
  const run = async (id, fn) => {
    try {
      set(id, true, (await fn()) || "ok");
      return true;
    } catch (e) {
      set(id, false, e.message || String(e));
      return false;
    }
  };
  if (v2) {
    await verifyLogged(bundle, jwks, run);
    return { ok: checks.every((c) => c.ok === true), format: RECEIPT_FORMAT, checks };
  }
  let receipt, pub, entry, cp;
  if (!bundle || bundle.format !== BUNDLE_FORMAT) {
    set("jws", false, "not a " + RECEIPT_FORMAT + " receipt nor a " + BUNDLE_FORMAT + " bundle");
    return { ok: false, format: bundle && bundle.format, checks };
  }
  const jwsOK = await run("jws", async () => {
    ({ receipt, pub } = await verifyReceipt(bundle.receipt, jwks));
    return "receipt " + receipt.receipt_id + " signed by " + (await thumbprint(pub));
  });
  const entryOK = await run("entry", async () => {
    if (typeof bundle.entry !== "string") throw new Error("entry is not a string");
    entry = parseEntry(bundle.entry);
    if (entry.kind !== "audit") throw new Error("the entry is of kind " + entry.kind + ", not audit");
    return "seq " + entry.seq + ", " + entry.entry_hash;
  });
  if (jwsOK && entryOK) {
    await run("agreement", async () => {
      if (receipt.ledger_seq !== entry.seq) throw new Error("ledger_seq " + receipt.ledger_seq + " is not the entry's seq " + entry.seq);
      if (receipt.ledger_entry_hash !== entry.entry_hash) throw new Error("ledger_entry_hash is not the entry's hash");
      for (const f of AGREEING) {
        if (canonicalize(receipt[f] ?? null) !== canonicalize(entry.body[f] ?? null)) {
          throw new Error(f + ": receipt " + JSON.stringify(receipt[f]) + ", entry " + JSON.stringify(entry.body[f]));
        }
      }
      return AGREEING.length + 2 + " fields agree";
    });
  }
  const cpOK = jwsOK && (await run("checkpoint", async () => {
    cp = await verifyCheckpoint(bundle.checkpoint, pub);
    return cp.origin + " size " + cp.size;
  }));
  if (cpOK && entryOK) {
    await run("inclusion", async () => checkInclusion(bundle.inclusion, entry, cp));
  }
  return { ok: checks.every((c) => c.ok === true), format: BUNDLE_FORMAT, checks };
}
