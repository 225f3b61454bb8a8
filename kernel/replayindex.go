package kernel

import (
	"bytes"
	"encoding/binary"

	"go.etcd.io/bbolt"
)

// bucketReplays indexes replays by the operation they replay: the
// original's operation id, a 0 byte and the replay's audit seq (8 bytes
// big-endian), each with an empty value. A replay's record commits with
// the original's salt, and its payload and stored envelope carry the
// original's args and result: erasing the original erases them too, which
// this index finds without reading the ledger. Replays recorded before
// the index was kept are not in it.
var bucketReplays = []byte("audit_replays")

// putReplay records that the audit record at seq replays operation orig.
func putReplay(tx *bbolt.Tx, orig string, seq uint64) error {
	b, err := tx.CreateBucketIfNotExists(bucketReplays)
	if err != nil {
		return err
	}
	return b.Put(binary.BigEndian.AppendUint64(append([]byte(orig), 0), seq), nil)
}

// replaysOf returns the audit seqs of the recorded replays of operation
// orig, in order.
func replaysOf(tx *bbolt.Tx, orig string) []uint64 {
	b := tx.Bucket(bucketReplays)
	if b == nil {
		return nil
	}
	prefix := append([]byte(orig), 0)
	var out []uint64
	c := b.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if len(k) == len(prefix)+8 {
			out = append(out, binary.BigEndian.Uint64(k[len(prefix):]))
		}
	}
	return out
}
