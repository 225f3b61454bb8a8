package txn

import (
	"bytes"
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"
)

// IdemKey scopes an idempotency key to the agent that sent it.
type IdemKey struct {
	AgentID string
	Key     string
}

func (k IdemKey) bytes() []byte {
	b := make([]byte, 0, len(k.AgentID)+1+len(k.Key))
	b = append(b, k.AgentID...)
	b = append(b, 0)
	return append(b, k.Key...)
}

// Call identifies what an idempotency key was first used for. A repeat
// replays only when all three fields match; any difference is a conflict.
// The row of an erased operation keeps no ArgsHash (EraseResult), and a
// repeat of its key is then compared by tool and token only (Lookup).
type Call struct {
	ToolID   string `json:"tool_id"`
	ArgsHash string `json:"args_hash"`
	TokenID  string `json:"capability_token_id"`
}

// idemRecord is a key's row. Result is the committed result envelope
// only where the operations table holds another one for OperationID (the
// lean copy of a read, without its result); where that table holds the
// same bytes, Result is empty and the envelope is read from there, so a
// keyed call's outcome is stored once. ArgsErased marks the erased form
// (EraseResult): the operation's audit payload was erased, and the row's
// ArgsHash with it.
type idemRecord struct {
	Call
	OperationID string          `json:"operation_id"`
	Done        bool            `json:"done"`
	ArgsErased  bool            `json:"args_erased,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
}

// done is the finished row of key holder id with outcome result, which
// leaves result out when the operations table holds the same envelope.
func done(tx *bbolt.Tx, c Call, id string, result json.RawMessage) idemRecord {
	r := idemRecord{Call: c, OperationID: id, Done: true, Result: result}
	if stored, err := GetOperation(tx, id); err == nil && bytes.Equal(result, stored) {
		r.Result = nil
	}
	return r
}

// outcome is the committed result envelope of the finished row r (read
// from the operations table when the row does not hold it).
func (r *idemRecord) outcome(tx *bbolt.Tx, k IdemKey) (json.RawMessage, error) {
	if len(r.Result) > 0 {
		return r.Result, nil
	}
	v, err := GetOperation(tx, r.OperationID)
	if err != nil {
		return nil, fmt.Errorf("txn: idempotency key %q: %w", k.Key, err)
	}
	if v == nil {
		return nil, fmt.Errorf("txn: idempotency key %q: operation %s holds no stored outcome", k.Key, r.OperationID)
	}
	return v, nil
}

// Lookup reports what a key holds for call c: the stored result envelope of
// a finished twin (replay), or an *Error (conflict, in flight), or nothing.
// A twin is a call of the same tool, args hash and token; a key whose
// operation was erased (EraseResult) takes every call of the same tool and
// token for its twin, whatever its args. The erased args are not kept to
// compare with, and an answer that depended on them would let whoever
// holds a token of the agent (and every auditor of the repeats' records)
// test guesses of a short one, a PIN, until one replays. A retry is still
// answered with the stored outcome, and no repeat of the key runs again.
func Lookup(tx *bbolt.Tx, k IdemKey, c Call) (replay json.RawMessage, err error) {
	v := tx.Bucket(bucketIdem).Get(k.bytes())
	if v == nil {
		return nil, nil
	}
	var r idemRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("txn: idempotency record for key %q: %w", k.Key, err)
	}
	switch {
	case r.ToolID != c.ToolID:
		return nil, refuse(ClassConflict, "idempotency key %q was used for tool %s, not %s", k.Key, r.ToolID, c.ToolID)
	case !r.ArgsErased && r.ArgsHash != c.ArgsHash:
		// Not the stored args_hash: the plain hash of the first call's
		// args, which the refusal would carry to the caller and into
		// the conflict's own audit record, beyond the first call's
		// erasure (the caller knows its own args).
		return nil, refuse(ClassConflict, "idempotency key %q was used with other args", k.Key)
	case r.TokenID != c.TokenID:
		return nil, refuse(ClassConflict, "idempotency key %q was used under capability token %s", k.Key, r.TokenID)
	case !r.Done:
		return nil, refuse(ClassInFlight, "a call with idempotency key %q (operation %s) is still running", k.Key, r.OperationID)
	}
	out, err := r.outcome(tx, k)
	return clone(out), err
}

func putIdem(tx *bbolt.Tx, k IdemKey, r idemRecord) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketIdem).Put(k.bytes(), v)
}

// IdemEntry is one row of the idempotency table. Its ArgsHash is empty in
// the row of an erased operation (EraseResult).
type IdemEntry struct {
	Key IdemKey
	Call
	OperationID string          // the operation that holds the key
	Done        bool            // false while that operation runs
	Result      json.RawMessage // the committed result envelope, when Done (valid during fn only)
}

// ForEachIdem calls fn for every row of the idempotency table and stops at
// fn's first error.
func ForEachIdem(tx *bbolt.Tx, fn func(IdemEntry) error) error {
	return tx.Bucket(bucketIdem).ForEach(func(k, v []byte) error {
		agent, key, ok := bytes.Cut(k, []byte{0})
		if !ok {
			return fmt.Errorf("txn: malformed idempotency key %q", k)
		}
		var r idemRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("txn: idempotency record for key %q: %w", key, err)
		}
		ik := IdemKey{AgentID: string(agent), Key: string(key)}
		var result json.RawMessage
		if r.Done {
			var err error
			if result, err = r.outcome(tx, ik); err != nil {
				return err
			}
		}
		return fn(IdemEntry{Key: ik, Call: r.Call, OperationID: r.OperationID, Done: r.Done, Result: result})
	})
}
