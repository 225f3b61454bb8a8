package jsonpack

import "slices"

// dictV1 is the string dictionary of format version 1 (Tag): a member
// name or a string value equal to dictV1[i] is stored as the one byte i.
// It holds the member names and common values of what the kernel stores
// (ledger records and bodies, audit payloads, result envelopes). The list
// is part of the stored format: entries are never changed, removed or
// reordered; a new dictionary needs a new tag. At most 128 entries.
var dictV1 = [...]string{
	// Ledger records.
	"body", "entry_hash", "kind", "prev_hash", "seq", "time",
	// Ledger kinds.
	"audit", "receipt", "token_first_seen", "revocation", "policy_loaded", "erasure",
	// Audit records and result envelopes.
	"agent_id", "tool_id", "operation_id", "capability_token_id", "token_hash",
	"policy_hash", "state_snapshot_id", "status", "result", "error", "result_hash",
	"args_hash", "args", "task_class", "autonomy_mode", "decided_mode",
	"risk_score", "risk_basis", "tx_outcome", "commit_delta_id", "receipt_id",
	"ledger_seq", "replayed", "audit_salt", "idempotency_key", "started_at",
	"payload_depth", "args_commitment", "result_commitment",
	"policy_input_commitment", "context_commitment", "provenance", "notes",
	"error_class", "error_message", "class", "message", "replay_of",
	"approval_id", "approval_state", "approved_by", "approval_reason",
	"recovery_salt", "recovery_args",
	// Audit payloads and policy inputs.
	"salt", "context", "policy_input", "policy_input_shares_args",
	"resources", "side_effect", "path", "real_path", "root", "op", "exists",
	"content", "size", "offset", "truncated", "bytes_returned", "hash",
	"new_hash",
	// Common values.
	"ok", "allow", "deny", "no_op", "committed", "aborted", "full",
	"commitments_only", "autopilot", "fs", "kv", "net", "exec", "read", "write",
	"READ", "WRITE", "fs.read", "fs.write", "fs.list", "fs.stat", "fs.delete",
	"kv.get", "kv.put", "kv.delete", "net.fetch", "exec.run",
	// Erasure records and tokens.
	"seqs", "reason", "by", "erased", "records", "aud", "cap", "exp", "iat",
	"iss", "jti", "nbf", "sub", "tools", "mode", "kernel_id", "files",
}

// lookup returns the byte of dictionary string s. It runs for every
// member name and string value packed, so it reads a table of its own
// rather than a map: no hashing of the whole string (the text of a
// payload is long), one probe for most names.
func lookup[T string | []byte](s T) (byte, bool) {
	n := len(s)
	if n == 0 || n > dictMaxLen {
		return 0, false
	}
	for h := dictHash(s); ; h = (h + 1) % dictSlots {
		e := &dictTable[h]
		if e.s == "" {
			return 0, false
		}
		if e.s == string(s) {
			return e.i, true
		}
	}
}

// dictSlots is the size of dictTable, a power of two well above the
// number of entries, so that probes stay short.
const dictSlots = 512

// dictHash mixes the length and the first, middle and last bytes of s.
func dictHash[T string | []byte](s T) uint32 {
	n := len(s)
	x := uint32(n) | uint32(s[0])<<8 | uint32(s[n/2])<<16 | uint32(s[n-1])<<24
	return x * 0x9e3779b1 >> (32 - 9) // 9 = log2(dictSlots)
}

// dictTable holds every dictionary string at its hash or, on a
// collision, in the next free slot (linear probing).
var dictTable = func() (t [dictSlots]struct {
	s string
	i byte
}) {
	if len(dictV1) > maxDict {
		panic("jsonpack: dictionary has more than 128 entries")
	}
	for i, s := range dictV1 {
		h := dictHash(s)
		for ; t[h].s != ""; h = (h + 1) % dictSlots {
			if t[h].s == s {
				panic("jsonpack: dictionary entry " + s + " twice")
			}
		}
		t[h].s, t[h].i = s, byte(i)
	}
	return t
}()

// dictMaxLen is the length of the longest dictionary string.
var dictMaxLen = len(slices.MaxFunc(dictV1[:], func(a, b string) int { return len(a) - len(b) }))
