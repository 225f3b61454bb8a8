// The console's check of an audit record's commitments against its
// payload: an independent implementation of docs/formats.md ("Payloads
// and commitments"), written from the spec, not from the Go code.
//
//   key(part)         = BLAKE3-derive_key("capkernel audit commitment v1 " + part, salt)
//   <part>_commitment = "blake3:" + hex(BLAKE3-keyed(key(part), canonical part bytes))
//
// openPayload says, for each of the four parts, what the page found:
//
//   matches   kept, and it opens the record's commitment
//   erased    an erasure record names the record: not tampering
//   not_kept  the record's depth (commitments_only) keeps no parts
//   absent    the call had no such part (no commitment)
//   withheld  the reader may not have the payload (another agent's record)
//   mismatch  kept, but it does not open the commitment: tampered
//   missing   committed and due, but neither kept nor erased: tampered

import { blake3 } from "@noble/hashes/blake3.js";
import { canonicalize, hex, unhex } from "./verify.js";

export const PARTS = ["args", "result", "policy_input", "context"];
const CONTEXT = "capkernel audit commitment v1 ";
const enc = new TextEncoder();

// TAMPERED are the part states that mean the store was tampered with.
export const TAMPERED = ["mismatch", "missing"];

// payloadState says what the record view shows of rec, the Record of
// GET /console/api/receipts/{id}/record ({entry, full, erasure}):
// {state, message}, state being one of
//
//   erased    an erasure record names the record (rec.erasure)
//   withheld  the session reads the record only as its public part
//   not_kept  depth commitments_only: nothing is stored, not even the salt
//   none      a record from before commitments: its parts are in its body
//   missing   committed, no payload and no erasure record: tampered
//   kept      the payload is here (its parts are shown)
//
// A commitments_only record has no payload (the kernel serves none, not
// even the salt an older kernel stored there alone), so it is told apart
// from a missing one by its depth, not by the payload.
export function payloadState(rec) {
  const depth = rec.entry.body.payload_depth;
  const p = rec.entry.payload;
  if (rec.erasure) return { state: "erased", message: "Erased: the payload was removed, and the record still verifies by its commitments." };
  if (!rec.full) return { state: "withheld", message: "Withheld: your credential reads another agent's record only as its public part (its commitments)." };
  if (depth === "commitments_only") {
    return { state: "not_kept", message: "Commitments only: nothing is kept, not even the salt; the agent holds the salt in the result envelope its call returned." };
  }
  if (!p && depth) return { state: "missing", message: "No payload kept, and no erasure record names this record." };
  if (!p) return { state: "none", message: "This record predates commitments: its parts are in its body." };
  return { state: "kept", message: "Kept beside the chain:" };
}

// partKey returns the 32-byte key of part's commitment under salt (64
// lowercase hex digits).
export function partKey(salt, part) {
  if (typeof salt !== "string" || !/^[0-9a-f]{64}$/.test(salt)) throw new Error("the salt is not 32 bytes of lowercase hex");
  return blake3(unhex(salt), { context: enc.encode(CONTEXT + part) });
}

// commit returns the commitment to the canonical bytes of a part under key.
export function commit(key, bytes) {
  return "blake3:" + hex(blake3(bytes, { key }));
}

// commitPart returns the commitment to value (a part as parsed from JSON,
// canonicalized here by RFC 8785) under salt.
export function commitPart(salt, part, value) {
  return commit(partKey(salt, part), enc.encode(canonicalize(value)));
}

// openPayload checks payload ({salt, args, result, policy_input, context},
// parsed JSON, or null when the reader got none) against the body of an
// audit record (its commitments and payload_depth). erased: an erasure
// record names the record; withheld: the reader may not have the
// payload. It returns {ok, tampered, parts: [{part, state, commitment,
// detail}]}; ok when no part is tampered.
export function openPayload(body, payload, { erased = false, withheld = false } = {}) {
  const parts = PARTS.map((part) => {
    const want = body[part + "_commitment"];
    const got = payload ? payload[part] : undefined;
    const r = { part, commitment: want || "", state: "", detail: "" };
    if (!want && got === undefined) r.state = "absent";
    else if (!want) Object.assign(r, { state: "mismatch", detail: "a part the record never committed to" });
    else if (got !== undefined) {
      try {
        const have = commitPart(payload.salt, part, got);
        if (have === want) Object.assign(r, { state: "matches", detail: "the payload opens the commitment" });
        else Object.assign(r, { state: "mismatch", detail: "the payload gives " + have });
      } catch (e) {
        Object.assign(r, { state: "mismatch", detail: e.message });
      }
    } else if (withheld) Object.assign(r, { state: "withheld", detail: "your credential reads this record only as its public part" });
    else if (erased) Object.assign(r, { state: "erased", detail: "removed by an erasure record" });
    else if (body.payload_depth === "commitments_only") Object.assign(r, { state: "not_kept", detail: "the record's depth keeps no parts" });
    else Object.assign(r, { state: "missing", detail: "committed, but neither kept nor erased" });
    return r;
  });
  const tampered = parts.some((p) => TAMPERED.includes(p.state));
  return { ok: !tampered, tampered, parts };
}
