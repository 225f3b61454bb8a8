// The Ledger view's witness: each checkpoint the page is shown is
// verified and proven consistent with the last one this browser verified
// for its signing key, by the rules of `kernelctl ledger checkpoint`
// (cmd/kernelctl/checkpointstate.go). A key signs one ledger: a
// checkpoint its key signed under another origin than the one remembered
// for it is refused (ORIGIN CHANGED), as is an origin remembered under
// another key (KEY CHANGED); a checkpoint that is not an extension of
// the one remembered (or, when older, a prefix of it) is refused
// (INCONSISTENT, FORK). The key is the JWKS key whose note key id the
// checkpoint's signature names, not the JWKS's first key.
import { noteKeyID, parseCheckpoint, verifyCheckpoint, verifyConsistency, hex, jwksKeys } from "./verify.js";

// STATE is the localStorage item holding what the witness remembers:
// {"keys": {<kid>: {"origin", "note", "seen_at"}}}, the last checkpoint
// verified per signing key (RFC 7638 thumbprint, the JWKS kid).
export const STATE = "capkernel.console.checkpoints";

// LEGACY is the item earlier versions kept: one note, of whichever key.
// It stands for the record of the key that signed it until that key's
// next checkpoint is remembered (and refuses another key's checkpoint of
// its origin, KEY CHANGED, as a record would).
export const LEGACY = "capkernel.console.checkpoint";

// signerOf returns the key of keys (jwksKeys' [{kid, pub}]) whose key id
// a signature line of note names under the note's origin, with the
// checkpoint it verifies; it throws when no such key is there or its
// signature does not verify.
export async function signerOf(note, keys) {
  const cp = parseCheckpoint(note);
  for (const key of keys) {
    const id = await noteKeyID(cp.origin, key.pub);
    if (cp.sigs.some((s) => s.name === cp.origin && hex(s.keyID) === hex(id))) return { key, cp: await verifyCheckpoint(note, key.pub) };
  }
  throw new Error("no key of the JWKS signs the checkpoint under its origin " + JSON.stringify(cp.origin));
}

function load(store) {
  try {
    const st = JSON.parse(store.getItem(STATE) || "{}");
    if (st && typeof st.keys === "object" && st.keys !== null) return st;
  } catch {
    // unreadable: start afresh
  }
  return { keys: {} };
}

// legacyOf returns the legacy note, if any, with its origin and whether
// key signed it (mine); null when there is none or it is unreadable.
async function legacyOf(store, key) {
  const note = store.getItem(LEGACY);
  if (!note) return null;
  let origin;
  try {
    origin = parseCheckpoint(note).origin;
  } catch {
    return null;
  }
  const mine = await verifyCheckpoint(note, key.pub).then(() => true, () => false);
  return { note, origin, mine };
}

// witness checks the checkpoint note (the kernel's GET
// /v1/ledger/checkpoint) against jwks (parsed, or its text) and what
// store (a localStorage) remembers. prove(from, to) returns the
// consistency proof between two sizes (an array of 32-byte hashes). It
// returns {checks: [[label, ok (true, false or null: skipped), detail]],
// kid, remembered}; a checkpoint is remembered for its key only when no
// check failed and it is not older than the one remembered.
export async function witness(note, jwks, store, prove, now = new Date()) {
  const checks = [];
  const { key, cp } = await signerOf(note, await jwksKeys(jwks));
  checks.push(["Signature by the kernel's key", true, `${cp.origin}, key ${key.kid}`]);
  const label = "Consistent with the last one seen";
  const st = load(store);
  const legacy = await legacyOf(store, key);
  // What is remembered for key: its record, else the legacy note when
  // key signed it.
  let seen = Object.hasOwn(st.keys, key.kid) ? st.keys[key.kid] : null;
  if (!seen && legacy?.mine) seen = { origin: legacy.origin, note: legacy.note, seen_at: "an earlier visit" };
  let remember = true;
  // Another key's record of this origin; the legacy note counts as one
  // when another key signed it.
  let other = Object.entries(st.keys).find(([kid, r]) => kid !== key.kid && r.origin === cp.origin);
  if (!other && legacy && !legacy.mine && legacy.origin === cp.origin) other = ["(another key)", { seen_at: "an earlier visit" }];
  try {
    if (seen && seen.origin !== cp.origin) {
      const old = parseCheckpoint(seen.note);
      throw new Error(`ORIGIN CHANGED: key ${key.kid} signed the checkpoint of origin ${JSON.stringify(seen.origin)} (size ${old.size}) seen at ${seen.seen_at}, ` +
        `and now one of origin ${JSON.stringify(cp.origin)} (size ${cp.size}): a key signs one ledger, so this is another history under a new name`);
    }
    if (!seen && other) {
      throw new Error(`KEY CHANGED: origin ${JSON.stringify(cp.origin)} was seen signed by key ${other[0]} at ${other[1].seen_at}, and is now signed by key ${key.kid}`);
    }
    if (!seen) {
      checks.push([label, null, "first checkpoint this browser has seen for this key"]);
    } else {
      const old = await verifyCheckpoint(seen.note, key.pub).catch((e) => {
        throw new Error("the remembered checkpoint does not verify: " + e.message);
      });
      if (cp.size < old.size) {
        verifyConsistency(cp.size, old.size, cp.root, old.root, await prove(cp.size, old.size));
        checks.push([label, true, `older than the checkpoint of size ${old.size} seen at ${seen.seen_at}, which is proved an extension of it; that one stays remembered`]);
        remember = false;
      } else if (cp.size === old.size) {
        if (hex(cp.root) !== hex(old.root)) throw new Error(`FORK: two signed checkpoints of size ${cp.size} with roots ${hex(old.root)} (seen at ${seen.seen_at}) and ${hex(cp.root)}`);
        checks.push([label, true, `same as the checkpoint seen at ${seen.seen_at}`]);
      } else {
        verifyConsistency(old.size, cp.size, old.root, cp.root, await prove(old.size, cp.size));
        checks.push([label, true, `size ${old.size} → ${cp.size}, proved an extension of the checkpoint seen at ${seen.seen_at}`]);
      }
    }
  } catch (e) {
    checks.push([label, false, e.message]);
    remember = false;
  }
  if (remember) {
    st.keys[key.kid] = { origin: cp.origin, note, seen_at: now.toISOString() };
    store.setItem(STATE, JSON.stringify(st));
    // The legacy note goes once its own key's record replaces it.
    if (legacy?.mine) store.removeItem(LEGACY);
  }
  return { checks, kid: key.kid, remembered: remember };
}
