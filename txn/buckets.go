package txn

import (
	"fmt"

	"go.etcd.io/bbolt"
)

// Bucket names. Every value is JSON; the operations table holds it packed
// (Operation).
var (
	bucketIdem   = []byte("idempotency") // agent_id \x00 key -> idemRecord
	bucketIntent = []byte("intents")     // operation_id -> Intent
	bucketDelta  = []byte("deltas")      // commit_delta_id -> Delta
	bucketBudget = []byte("budgets")     // capability_token_id -> Usage
	bucketKV     = []byte("kv")          // key -> kvValue
	bucketOps    = []byte("operations")  // operation_id -> result envelope
	// bucketOrder lists the commit_delta_ids in commit order: big-endian
	// commit sequence number -> commit_delta_id.
	bucketOrder = []byte("delta_order")
)

// Init creates the package's buckets if they are missing.
func Init(tx *bbolt.Tx) error {
	for _, b := range [][]byte{bucketIdem, bucketIntent, bucketDelta, bucketBudget, bucketKV, bucketOps, bucketOrder} {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return fmt.Errorf("txn: create bucket %s: %w", b, err)
		}
	}
	return nil
}
