package conformance

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
)

// An audit record's body holds commitments to the call's parts (args,
// result, policy input, context) and the parts live beside the chain; a
// reader of the record in full gets them as the entry's "payload" with
// the salt. The suite opens every payload it is given by the spec
// (docs/formats.md), independently of the kernel's code.

// commitment is the spec's commitment to part name's canonical bytes b
// under salt: keyed BLAKE3 under BLAKE3-derive_key("capkernel audit
// commitment v1 <name>", salt). The salt must be 32 bytes in lowercase
// hex, the one spelling the verifiers (kernel.CheckPayload, receipts
// verify, the console) accept: a kernel whose salts they refuse does not
// pass the suite.
func commitment(salt, name string, b []byte) (string, error) {
	if len(salt) != 64 || strings.Trim(salt, "0123456789abcdef") != "" {
		return "", fmt.Errorf("audit salt %q is not 32 bytes of lowercase hex", salt)
	}
	raw, _ := hex.DecodeString(salt)
	var key [32]byte
	blake3.DeriveKey("capkernel audit commitment v1 "+name, raw, key[:])
	h, _ := blake3.NewKeyed(key[:])
	h.Write(b)
	return digest.Format([32]byte(h.Sum(nil))), nil
}

// exactCanonical is the canonical form of the JSON text b, refusing a
// number whose decimal is not that of its canonical form
// (jcs.CanonicalizeExact), as the verifiers do: such a number would open
// the commitment to another decimal.
func exactCanonical(b []byte) ([]byte, error) { return jcs.CanonicalizeExact(b) }

// exactMarshal is v encoded with encoding/json in exactCanonical form.
func exactMarshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return exactCanonical(b)
}

// OpenBody returns e's body as TOOL-01 §3 names its fields: for a record
// with commitments, each part of its payload is checked against its
// commitment (a part that does not open it fails the case) and the
// record's args_hash, result_hash, error_message, policy_input,
// provenance, notes, approval_reason and risk_basis are read back from the
// parts.
func (t *T) OpenBody(e Entry) map[string]json.RawMessage {
	var body map[string]json.RawMessage
	if err := json.Unmarshal(e.Body, &body); err != nil {
		t.Failf("ledger entry %d body: %v", e.Seq, err)
	}
	if len(e.Payload) == 0 {
		return body
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		t.Failf("ledger entry %d payload: %v", e.Seq, err)
	}
	salt := str(p["salt"])
	for _, name := range []string{"args", "result", "policy_input", "context"} {
		part, ok := p[name]
		if !ok {
			continue
		}
		canon, err := exactCanonical(part)
		if err != nil {
			t.Failf("entry %d payload %s: %v", e.Seq, name, err)
		}
		got, err := commitment(salt, name, canon)
		if err != nil {
			t.Failf("entry %d payload: %v", e.Seq, err)
		}
		if want := str(body[name+"_commitment"]); got != want {
			t.Failf("entry %d: payload %s does not open the record's commitment (%s, recomputed %s)", e.Seq, name, want, got)
		}
		sum, _ := json.Marshal(digest.Sum(canon))
		switch name {
		case "args":
			body["args_hash"] = sum
			if form, ok := argsDigestForm(canon); ok {
				body["args_hash"], _ = json.Marshal(form)
			}
		case "result":
			body["result_hash"] = sum
			var r struct {
				Error struct {
					Message json.RawMessage `json:"message"`
				} `json:"error"`
			}
			json.Unmarshal(part, &r)
			if r.Error.Message != nil {
				body["error_message"] = r.Error.Message
			}
		case "policy_input":
			body["policy_input"] = part
		case "context":
			var c map[string]json.RawMessage
			json.Unmarshal(part, &c)
			for k, v := range c {
				body[k] = v
			}
		}
	}
	return body
}

// argsDigestForm reads an args part in the digest form a refused call's
// record may keep instead of its args (docs/formats.md, "Refused calls
// keep their args' digest"): the canonical array ["<args_hash>",<size>].
// It returns the args_hash, and whether the part is that form (args are
// an object).
func argsDigestForm(canon []byte) (string, bool) {
	var v []json.RawMessage
	if json.Unmarshal(canon, &v) != nil || len(v) != 2 {
		return "", false
	}
	var sum string
	var size uint64
	if json.Unmarshal(v[0], &sum) != nil || !hashRE.MatchString(sum) || json.Unmarshal(v[1], &size) != nil {
		return "", false
	}
	return sum, true
}

// resultCanonical is the canonical {"status","result"} or
// {"status","error"} object of a result envelope: what result_hash hashes
// and the record's result commitment commits to. It fails on a result
// holding a number that is not its canonical decimal (exactCanonical).
func resultCanonical(r *Result) ([]byte, error) {
	v := map[string]any{"status": r.Status}
	if r.Error != nil {
		v["error"] = r.Error
	} else {
		v["result"] = r.Result
	}
	return exactMarshal(v)
}
