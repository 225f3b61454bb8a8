package ledger

import (
	"bytes"
	"fmt"
	"maps"
	"testing"

	"go.etcd.io/bbolt"
)

// putRawCheckpoint stores v (packed or not, and possibly damaged) as
// checkpoint #num, unchecked, the way a tamperer would: under
// checkpointKey(size, num), size being the tree size v's note states, or,
// when it states none, the size of the checkpoint #num it replaces (0 if
// there is none). Any checkpoint stored under number num is removed, and
// the new one is recorded as the latest (keyLastCheckpoint) unless a
// higher-numbered one is recorded: the old layout's checkpoint bucket
// (keyed by number) made the highest number the latest.
func putRawCheckpoint(tx *bbolt.Tx, num uint64, v []byte) error {
	var size uint64
	replaced := storedCheckpointKeys(tx, num)
	if len(replaced) > 0 {
		size, _, _ = parseCheckpointKey(replaced[0])
	}
	if signed, err := loadCheckpoint(v); err == nil {
		if cp, _, err := parseSigned(signed); err == nil {
			size = cp.Size
		}
	}
	for _, k := range replaced {
		if err := tx.Bucket(bucketEntries).Delete(k); err != nil {
			return err
		}
	}
	return putCheckpointAt(tx, size, num, v)
}

// putCheckpointAt stores v under checkpointKey(size, num), whatever size
// its note states, and records it as the latest unless a higher-numbered
// one is recorded.
func putCheckpointAt(tx *bbolt.Tx, size, num uint64, v []byte) error {
	meta := tx.Bucket(bucketMeta)
	k := checkpointKey(size, num)
	if err := tx.Bucket(bucketEntries).Put(k, v); err != nil {
		return err
	}
	if last := meta.Get(keyLastCheckpoint); last != nil {
		if _, n, ok := parseCheckpointKey(last); ok && n > num {
			return nil
		}
	}
	return meta.Put(keyLastCheckpoint, k)
}

// dumpKind returns a copy of every key and value of one kind stored in the
// ledger's bucket, in key order.
func dumpKind(tb testing.TB, db *bbolt.DB, kind keyKind) [][2][]byte {
	tb.Helper()
	var out [][2][]byte
	if err := db.View(func(tx *bbolt.Tx) error {
		c := newKindCursor(tx.Bucket(bucketEntries), kind)
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if kindOf(k) != kind {
				return fmt.Errorf("malformed key %x", k)
			}
			out = append(out, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

// storedCheckpointKeys returns the keys under which checkpoint #num is
// stored: one, unless the ledger is damaged.
func storedCheckpointKeys(tx *bbolt.Tx, num uint64) [][]byte {
	var keys [][]byte
	c := newKindCursor(tx.Bucket(bucketEntries), kindCheckpoint)
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		if _, n, _ := parseCheckpointKey(k); n == num {
			keys = append(keys, bytes.Clone(k))
		}
	}
	return keys
}

// storedCheckpointKey returns the key of checkpoint #num, or nil when none
// is stored.
func storedCheckpointKey(tx *bbolt.Tx, num uint64) []byte {
	if keys := storedCheckpointKeys(tx, num); len(keys) > 0 {
		return keys[0]
	}
	return nil
}

// layoutTreeless stands, in toOldLayout, for a file of a build from
// before the Merkle tree and the checkpoints existed: entries and the head
// only.
const layoutTreeless = 0

// toOldLayout rewrites db, a ledger of layoutOneBucket, as a build of an
// older layout stored the same ledger: the tree in a bucket of its own
// (bucketTree), under level-major keys and no layout recorded
// (layoutLevelMajor) or under the same keys as now and layout 02 recorded
// (layoutCompletion); the checkpoints in theirs (bucketCheckpoints), keyed
// by number; no checkpoint_last. layoutTreeless drops the tree and needs a
// ledger without checkpoints. Older builds had no attachments: db must
// hold none.
func toOldLayout(tb testing.TB, db *bbolt.DB, layout int) {
	tb.Helper()
	if err := db.Update(func(tx *bbolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		var records, nodes, cps [][2][]byte
		c := tx.Bucket(bucketEntries).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			kv := [2][]byte{bytes.Clone(k), bytes.Clone(v)}
			switch kindOf(k) {
			case kindEntry:
				records = append(records, kv)
			case kindNode:
				nodes = append(nodes, kv)
			case kindCheckpoint:
				cps = append(cps, kv)
			default:
				return fmt.Errorf("key %x: no older layout stores it", k)
			}
		}
		// The entries' bucket, rewritten as appends filled it: full pages.
		if err := tx.DeleteBucket(bucketEntries); err != nil {
			return err
		}
		entries, err := tx.CreateBucket(bucketEntries)
		if err != nil {
			return err
		}
		entries.FillPercent = 1
		for _, kv := range records {
			if err := entries.Put(kv[0], kv[1]); err != nil {
				return err
			}
		}
		if err := meta.Delete(keyLastCheckpoint); err != nil {
			return err
		}
		if layout == layoutTreeless {
			if len(cps) > 0 {
				return fmt.Errorf("%d checkpoints in a ledger to store as a build before checkpoints existed", len(cps))
			}
			return meta.Delete(keyTreeLayout)
		}
		tree, err := tx.CreateBucket(bucketTree)
		if err != nil {
			return err
		}
		for _, kv := range nodes {
			k := kv[0]
			if layout == layoutLevelMajor {
				id, _ := completionID(k)
				k = levelMajorKey(id)
			}
			if err := tree.Put(k, kv[1]); err != nil {
				return err
			}
		}
		b, err := tx.CreateBucket(bucketCheckpoints)
		if err != nil {
			return err
		}
		for _, kv := range cps {
			_, num, _ := parseCheckpointKey(kv[0])
			if err := b.Put(seqKey(num), kv[1]); err != nil {
				return err
			}
		}
		if layout == layoutLevelMajor {
			return meta.Delete(keyTreeLayout)
		}
		return meta.Put(keyTreeLayout, []byte{byte(layout)})
	}); err != nil {
		tb.Fatal(err)
	}
}

// dumpAll returns a copy of every top-level bucket of db, by name.
func dumpAll(tb testing.TB, db *bbolt.DB) map[string][][2][]byte {
	tb.Helper()
	out := map[string][][2][]byte{}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
			var kvs [][2][]byte
			err := b.ForEach(func(k, v []byte) error {
				kvs = append(kvs, [2][]byte{bytes.Clone(k), bytes.Clone(v)})
				return nil
			})
			out[string(name)] = kvs
			return err
		})
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

func equalDumpAll(a, b map[string][][2][]byte) bool {
	return maps.EqualFunc(a, b, equalDumps)
}
