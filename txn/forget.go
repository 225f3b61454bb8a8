package txn

import (
	"encoding/json"
	"fmt"

	"go.etcd.io/bbolt"
)

// EraseResult turns the row of key k into its erased form when the key is
// done and held by operation id; otherwise it does nothing. Erasing an
// audit payload uses it: result replaces the stored result envelope (the
// copy kept for replays, now without what the erasure removed), and the
// row forgets the call's args_hash. From then on Lookup answers every
// repeat of the key by the same tool and token with result, whatever its
// args (see Lookup for why).
func EraseResult(tx *bbolt.Tx, k IdemKey, id string, result json.RawMessage) error {
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
	c := r.Call
	c.ArgsHash = ""
	e := done(tx, c, id, result)
	e.ArgsErased = true
	return putIdem(tx, k, e)
}
