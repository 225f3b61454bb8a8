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
type Call struct {
	ToolID   string `json:"tool_id"`
	ArgsHash string `json:"args_hash"`
	TokenID  string `json:"capability_token_id"`
}

type idemRecord struct {
	Call
	OperationID string          `json:"operation_id"`
	Done        bool            `json:"done"`
	Result      json.RawMessage `json:"result,omitempty"`
}

// Lookup reports what a key holds for call c: the stored result envelope of
// a finished twin (replay), or an *Error (conflict, in flight), or nothing.
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
	case r.ArgsHash != c.ArgsHash:
		return nil, refuse(ClassConflict, "idempotency key %q was used with other args (%s)", k.Key, r.ArgsHash)
	case r.TokenID != c.TokenID:
		return nil, refuse(ClassConflict, "idempotency key %q was used under capability token %s", k.Key, r.TokenID)
	case !r.Done:
		return nil, refuse(ClassInFlight, "a call with idempotency key %q (operation %s) is still running", k.Key, r.OperationID)
	}
	return append(json.RawMessage(nil), r.Result...), nil
}

func putIdem(tx *bbolt.Tx, k IdemKey, r idemRecord) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketIdem).Put(k.bytes(), v)
}

// IdemEntry is one row of the idempotency table.
type IdemEntry struct {
	Key IdemKey
	Call
	OperationID string          // the operation that holds the key
	Done        bool            // false while that operation runs
	Result      json.RawMessage // the committed result envelope, when Done
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
		return fn(IdemEntry{Key: IdemKey{AgentID: string(agent), Key: string(key)}, Call: r.Call, OperationID: r.OperationID, Done: r.Done, Result: r.Result})
	})
}
