package txn

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
)

// Intent states.
const (
	Prepared = "prepared"
	Decided  = "decided"
)

// StageDir is a directory where a call may leave staging files: Dir is
// relative to the root directory Root.
type StageDir struct {
	Root string `json:"root"`
	Dir  string `json:"dir"`
}

// Intent is the durable record of a mutating call between prepare and the
// end of apply.
type Intent struct {
	OperationID string `json:"operation_id"`
	State       string `json:"state"`
	AgentID     string `json:"agent_id"`
	IdemKey     string `json:"idempotency_key,omitempty"`
	TokenID     string `json:"capability_token_id"`
	// Ancestors are the tokens TokenID was attenuated from, with their
	// limits: the call is charged to each of them too.
	Ancestors []Account  `json:"ancestors,omitempty"`
	Reserved  Usage      `json:"reserved"`
	Dirs      []StageDir `json:"dirs,omitempty"`
	Effects   []Effect   `json:"effects,omitempty"`
	DeltaID   string     `json:"commit_delta_id,omitempty"`
	// CommitSeq numbers decided intents in commit order (from 1), so that
	// recovery applies them in that order (0: decided before it existed).
	CommitSeq uint64 `json:"commit_seq,omitempty"`
	// External marks a call whose execution may have an effect outside the
	// kernel's reach (a NETWORK syscall: an HTTP request that is not a
	// read). Recovery never rolls such a call back as if nothing happened:
	// it records it as outcome_unknown (see Unknown).
	External bool `json:"external,omitempty"`
	// Read marks an External call that changes nothing (an HTTP GET): it
	// too is recorded as outcome_unknown at recovery, since its request
	// may have gone out, but its idempotency key is released as a
	// rollback's is, so that a repeat runs again.
	Read bool `json:"read,omitempty"`
	// Used is what the execution consumed beyond its staged effects
	// (cpu_ms, net_bytes); it is charged whether the call commits or not.
	Used  Usage           `json:"used,omitempty"`
	Audit json.RawMessage `json:"audit,omitempty"` // the kernel's context for a recovery audit record
}

// accounts are the budgets the call of in is charged to: its token's,
// with limits, then its ancestors'.
func (in *Intent) accounts(limits Usage) []Account {
	return append([]Account{{TokenID: in.TokenID, Limits: limits}}, in.Ancestors...)
}

func (in *Intent) idemKey() (IdemKey, bool) {
	return IdemKey{AgentID: in.AgentID, Key: in.IdemKey}, in.IdemKey != ""
}

// Intents returns every intent in tx, in operation id order.
func Intents(tx *bbolt.Tx) ([]Intent, error) {
	var out []Intent
	err := tx.Bucket(bucketIntent).ForEach(func(k, v []byte) error {
		var in Intent
		if err := json.Unmarshal(v, &in); err != nil {
			return fmt.Errorf("txn: intent %s: %w", k, err)
		}
		out = append(out, in)
		return nil
	})
	return out, err
}

// Delta is what a committed call changed; it is stored under its own
// digest, the commit_delta_id.
//
// The id is public (audit records carry it) and the changes hold digests
// of what was written and its size, so Salt, random per delta and kept
// only in the stored delta, is hashed with them: without it anyone could
// confirm a guess of a written file's content or a kv value by hashing the
// delta it would make. A delta stored before the salt has none.
type Delta struct {
	OperationID string        `json:"operation_id"`
	Salt        string        `json:"salt,omitempty"`
	Changes     []DeltaChange `json:"changes"`
}

// DeltaSaltSize is the number of random bytes in a Delta's salt (hex in
// Delta.Salt).
const DeltaSaltSize = 32

// DeltaChange is one change of a Delta: a file written or deleted (Path
// relative to Root, content digests before and after, size after), a
// directory made (op mkdir) or a kv key put (versions before and after,
// digest of the value).
type DeltaChange struct {
	Op         string `json:"op"`
	Root       string `json:"root,omitempty"`
	Path       string `json:"path,omitempty"`
	Key        string `json:"key,omitempty"`
	OldHash    string `json:"old_hash,omitempty"`
	NewHash    string `json:"new_hash,omitempty"`
	Size       int64  `json:"size"`
	OldVersion uint64 `json:"old_version,omitempty"`
	NewVersion uint64 `json:"new_version,omitempty"`
}

// NewDelta builds the delta of effects, with a fresh salt, and returns it
// in canonical JSON with its id: the digest of those bytes.
func NewDelta(operationID string, effects []Effect) (id string, canonical []byte, err error) {
	var salt [DeltaSaltSize]byte
	if _, err := rand.Read(salt[:]); err != nil {
		return "", nil, fmt.Errorf("txn: delta salt: %w", err)
	}
	d := Delta{OperationID: operationID, Salt: hex.EncodeToString(salt[:]), Changes: make([]DeltaChange, 0, len(effects))}
	for _, e := range effects {
		if e.Op == OpCleanup {
			continue
		}
		d.Changes = append(d.Changes, e.change())
	}
	canonical, err = jcs.Marshal(d)
	if err != nil {
		return "", nil, err
	}
	return digest.Sum(canonical), canonical, nil
}

// GetDelta returns the stored delta named id, or nil.
func GetDelta(tx *bbolt.Tx, id string) json.RawMessage {
	return clone(tx.Bucket(bucketDelta).Get([]byte(id)))
}

// Dirs lists, without duplicates, the parent directories of paths (relative
// to root) where staging files for them will go.
func Dirs(root string, rels ...string) []StageDir {
	var out []StageDir
	seen := map[string]bool{}
	for _, r := range rels {
		d := path.Dir(r)
		if !seen[d] {
			seen[d] = true
			out = append(out, StageDir{Root: root, Dir: d})
		}
	}
	return out
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
