package txn

import (
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"
)

// ReplaceResult replaces the stored result envelope of key k when the key
// is done and held by operation id; otherwise it does nothing. Erasing an
// audit payload uses it to drop the copy of the result kept for replays:
// a repeat then answers with the outcome (status, hashes) without it.
func ReplaceResult(tx *bbolt.Tx, k IdemKey, id string, result json.RawMessage) error {
	v := tx.Bucket(bucketIdem).Get(k.bytes())
	if v == nil {
		return nil
	}
	var r idemRecord
	if err := json.Unmarshal(v, &r); err != nil {
		return fmt.Errorf("txn: idempotency record for key %q: %w", k.Key, err)
	}
	if !r.Done || r.OperationID != id {
		return nil
	}
	return putIdem(tx, k, done(tx, r.Call, id, result))
}
