package kernel

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"
)

// The ledger's buckets and keys (ledger/onebucket.go, ledger/attachments.go),
// written here independently of the ledger package, for tests that damage
// what it stores.
var (
	bucketLedger   = []byte("ledger")
	bucketPayloads = []byte("audit_payloads") // the ledger's attachments
)

// payloadKey is the key of the payload (the ledger attachment) of entry seq.
func payloadKey(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

// checkpointKey is the key of checkpoint num, of tree size size.
func checkpointKey(size, num uint64) []byte {
	k := append(binary.BigEndian.AppendUint64(nil, size), 0xC0)
	return binary.BigEndian.AppendUint64(k, num)
}

// toLayout2 rewrites the closed kernel's file in the storage layout of
// builds before layout 3 (docs/formats.md): tree nodes in ledger_tree
// under their own keys, checkpoints in ledger_checkpoints under their
// number alone, tree_layout 02 and no checkpoint_last (payloads are in
// audit_payloads in both).
func toLayout2(t *testing.T, data string) {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(data, DBFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error {
		tree, err := tx.CreateBucket([]byte("ledger_tree"))
		if err != nil {
			return err
		}
		cps, err := tx.CreateBucket([]byte("ledger_checkpoints"))
		if err != nil {
			return err
		}
		l := tx.Bucket(bucketLedger)
		var moved [][]byte
		c := l.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			var err error
			switch {
			case len(k) == 8:
				continue
			case len(k) == 9 && k[8] < 64:
				err = tree.Put(bytes.Clone(k), bytes.Clone(v))
			case len(k) == 17 && k[8] == 0xC0:
				err = cps.Put(bytes.Clone(k[9:]), bytes.Clone(v))
			default:
				t.Fatalf("key %x of no kind", k)
			}
			if err != nil {
				return err
			}
			moved = append(moved, bytes.Clone(k))
		}
		for _, k := range moved {
			if err := l.Delete(k); err != nil {
				return err
			}
		}
		meta := tx.Bucket([]byte("ledger_meta"))
		if err := meta.Delete([]byte("checkpoint_last")); err != nil {
			return err
		}
		return meta.Put([]byte("tree_layout"), []byte{2})
	}); err != nil {
		t.Fatal(err)
	}
}

// toLayout1 is toLayout2, then the tree keyed level-major (level || index)
// and no tree_layout recorded: a data dir of a build before layouts were
// recorded.
func toLayout1(t *testing.T, data string) {
	t.Helper()
	toLayout2(t, data)
	db, err := bbolt.Open(filepath.Join(data, DBFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bbolt.Tx) error {
		var kvs [][2][]byte
		if err := tx.Bucket([]byte("ledger_tree")).ForEach(func(k, v []byte) error {
			end, level := binary.BigEndian.Uint64(k), k[8]
			kvs = append(kvs, [2][]byte{append([]byte{level}, binary.BigEndian.AppendUint64(nil, end>>level)...), bytes.Clone(v)})
			return nil
		}); err != nil {
			return err
		}
		if err := tx.DeleteBucket([]byte("ledger_tree")); err != nil {
			return err
		}
		b, err := tx.CreateBucket([]byte("ledger_tree"))
		if err != nil {
			return err
		}
		for _, kv := range kvs {
			if err := b.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("ledger_meta")).Delete([]byte("tree_layout"))
	}); err != nil {
		t.Fatal(err)
	}
}
