package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"go.etcd.io/bbolt"
)

// layoutOneBucket (recorded in ledger_meta under keyTreeLayout as the
// single byte 03) keeps the records, the tree and the checkpoints in one
// bucket, bucketEntries, under keys that ascend in the order appends
// write them:
//
//	seq (8 bytes big-endian)                      the entry's record
//	completion (8) || level (1 byte, 0..63)       a Merkle tree node (layoutCompletion's key)
//	size (8) || 0xC0 || num (8 bytes big-endian)  checkpoint #num, of tree size size
//
// A group commit then writes its entries, their nodes and its checkpoint
// at the tail of one B+tree: one path of pages, where buckets of their
// own wrote three. (Attachments, which are most of a call's bytes, keep a
// bucket of their own: see attachments.go.)
//
// Every key of a ledger of n entries sorts before n's own 8 bytes but for
// the checkpoints of size n, which sort after them (beyondHead): once
// entry n is appended, they sort after its keys (entry, nodes) and before
// entry n+1's, so the first keys of the commit after a checkpoint go just
// before it, in the bucket's last page (which bbolt never leaves with
// fewer than two keys).
//
// Readers walk one kind of key with a kindCursor. ledger_meta records the
// latest checkpoint's key (keyLastCheckpoint), so that finding it, and
// the next checkpoint's number, reads no more than one key.
const layoutOneBucket = 3

// tagCheckpoint is the byte after the first 8 of a checkpoint's key.
const tagCheckpoint = 0xC0

const checkpointKeyLen = 17

// keyLastCheckpoint is the meta key holding the latest checkpoint's key.
var keyLastCheckpoint = []byte("checkpoint_last")

// keyKind is the kind of record a key of layoutOneBucket names.
type keyKind uint8

const (
	kindMalformed keyKind = iota // a key of no kind: damage, or another build's
	kindEntry
	kindNode
	kindCheckpoint
)

// kindOf returns the kind of record key k names, by its length and tag.
// A node key is also checked to name a node (completionID).
func kindOf(k []byte) keyKind {
	switch {
	case len(k) == 8:
		return kindEntry
	case len(k) == treeKeyLen:
		if _, ok := completionID(k); ok {
			return kindNode
		}
	case len(k) == checkpointKeyLen:
		if k[8] == tagCheckpoint {
			return kindCheckpoint
		}
	}
	return kindMalformed
}

// kindCursor walks the keys of one kind of the one bucket, in key order,
// stepping over the others. The entries' cursor (withMalformed) also
// stops at keys of no kind, so that the entry walks, which every check
// makes, report them.
type kindCursor struct {
	c             *bbolt.Cursor
	kind          keyKind
	withMalformed bool
}

func newKindCursor(b *bbolt.Bucket, kind keyKind) *kindCursor {
	return &kindCursor{c: b.Cursor(), kind: kind, withMalformed: kind == kindEntry}
}

func (kc *kindCursor) forward(k, v []byte) ([]byte, []byte) {
	for ; k != nil; k, v = kc.c.Next() {
		if kind := kindOf(k); kind == kc.kind || kc.withMalformed && kind == kindMalformed {
			return k, v
		}
	}
	return nil, nil
}

// First moves to the first key of the kind.
func (kc *kindCursor) First() ([]byte, []byte) { return kc.forward(kc.c.First()) }

// Next moves to the next key of the kind.
func (kc *kindCursor) Next() ([]byte, []byte) { return kc.forward(kc.c.Next()) }

// Seek moves to the first key of the kind at or after seek.
func (kc *kindCursor) Seek(seek []byte) ([]byte, []byte) { return kc.forward(kc.c.Seek(seek)) }

// checkpointKey returns the key of checkpoint num, of tree size size.
func checkpointKey(size, num uint64) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, checkpointKeyLen), size)
	return binary.BigEndian.AppendUint64(append(k, tagCheckpoint), num)
}

// parseCheckpointKey returns the size and number a checkpoint key holds.
func parseCheckpointKey(k []byte) (size, num uint64, ok bool) {
	if len(k) != checkpointKeyLen || k[8] != tagCheckpoint {
		return 0, 0, false
	}
	return binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(k[9:]), true
}

// beyondHead describes the first key stored at or after position n (the
// head's entry count) that no ledger of n entries holds, or returns "":
// only checkpoints of size n may sort there. (attachedBeyond checks the
// attachments.)
func beyondHead(entries *bbolt.Bucket, n uint64) string {
	c := entries.Cursor()
	for k, _ := c.Seek(seqKey(n)); k != nil; k, _ = c.Next() {
		switch kindOf(k) {
		case kindCheckpoint:
			if binary.BigEndian.Uint64(k) == n {
				continue
			}
			return fmt.Sprintf("a checkpoint of size %d", binary.BigEndian.Uint64(k))
		case kindEntry:
			return fmt.Sprintf("entry %d", binary.BigEndian.Uint64(k))
		case kindNode:
			id, _ := completionID(k)
			return nodeName(id)
		default:
			return fmt.Sprintf("a malformed key %s", keyText(k))
		}
	}
	return ""
}

// Move moves a file of an older layout a step towards layoutOneBucket
// within tx, and reports whether it is there (nothing written then). A
// step does one of:
//
//   - on a ledger made before the Merkle tree existed, build the tree
//     (migrateTree), in a bucket of layout 2;
//   - on a tree of layout 1, rekey it to layout 2 (rekeyTree);
//   - move up to max keys (all when max is 0) of the layout-2 tree and
//     checkpoint buckets into bucketEntries, deleting each moved key:
//     nodes under their own keys, then checkpoint #num under
//     checkpointKey(size, num), each recorded as the latest as it moves;
//   - once both are empty, delete them and record layoutOneBucket.
//
// The first two hold the whole tree in memory (see rekeyTree); a bounded
// move holds at most max keys. Steps may be committed apart, each in a
// transaction of its own: a file between steps is of layout 2 with some
// of its keys already moved, which Move goes on with and every reader
// refuses (errOldLayout), as it does a layout-2 file. A key that cannot
// be moved (see CheckMove) is refused, and tx must then be rolled back;
// a caller that commits steps apart runs CheckMove first, so that a
// damaged key stops the move before any step is committed and the file
// stays as the build that wrote it left it.
func Move(tx *bbolt.Tx, max int) (done bool, err error) {
	entries, meta := tx.Bucket(bucketEntries), tx.Bucket(bucketMeta)
	if entries == nil && meta == nil {
		return true, nil // a new file: Init makes it in layoutOneBucket
	}
	if entries == nil || meta == nil {
		return false, errors.New("ledger: one of the buckets is missing (the ledger is damaged)")
	}
	layout, err := treeLayout(meta)
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	tree, cps := tx.Bucket(bucketTree), tx.Bucket(bucketCheckpoints)
	if layout == layoutOneBucket {
		for _, name := range [][]byte{bucketTree, bucketCheckpoints} {
			if tx.Bucket(name) != nil {
				return false, fmt.Errorf("ledger: the file is in key layout %d, yet holds the bucket %q of an older layout (a build from before layout %d wrote to it; the database is unchanged: restore it from a backup)", layoutOneBucket, name, layoutOneBucket)
			}
		}
		return true, nil
	}
	switch {
	case tree == nil:
		if _, err := tx.CreateBucket(bucketTree); err != nil {
			return false, fmt.Errorf("ledger: create bucket %q: %w", bucketTree, err)
		}
		if err := migrateTree(tx); err != nil {
			return false, err
		}
		if max > 0 {
			return false, nil
		}
	case layout == layoutLevelMajor:
		if err := rekeyTree(tx, meta); err != nil {
			return false, err
		}
		if max > 0 {
			return false, nil
		}
	case layout == layoutCompletion:
		if err := checkOtherLayout(tree, meta, false); err != nil {
			return false, err
		}
		// Nothing moved yet: a record of a latest checkpoint is stray.
		if err := meta.Delete(keyLastCheckpoint); err != nil {
			return false, fmt.Errorf("ledger: %w", err)
		}
	}
	tree, cps = tx.Bucket(bucketTree), tx.Bucket(bucketCheckpoints)
	entries.FillPercent = 1
	left := max
	if left <= 0 {
		left = -1
	}
	prev := movedSize(entries, meta)
	n, _, err := readHead(meta)
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	for _, b := range []*bbolt.Bucket{tree, cps} {
		if b == nil {
			continue
		}
		var keys [][]byte
		c := b.Cursor()
		for k, v := c.First(); k != nil && left != 0; k, v = c.Next() {
			nk, err := movedKey(b == cps, k, v, &prev, n)
			if err == nil && entries.Get(nk) != nil {
				err = takenError(k, nk)
			}
			if err != nil {
				return false, err
			}
			if b == cps {
				if err := meta.Put(keyLastCheckpoint, nk); err != nil {
					return false, fmt.Errorf("ledger: move checkpoint #%d: %w", binary.BigEndian.Uint64(k), err)
				}
			}
			if err := entries.Put(nk, v); err != nil {
				return false, fmt.Errorf("ledger: move key %x into %q: %w", k, bucketEntries, err)
			}
			keys = append(keys, k)
			left--
		}
		// bbolt keeps the values put above valid until tx ends; a key is
		// deleted once the cursor has passed it.
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return false, fmt.Errorf("ledger: move key %x out of %q: %w", k, bucketTreeOrCheckpoints(b == cps), err)
			}
		}
		if left == 0 {
			// Moved in part: recorded so (layoutMoving) for the builds
			// of layout 2, which would read the moved nodes as missing.
			return false, putLayout(meta, layoutMoving)
		}
	}
	for _, name := range [][]byte{bucketTree, bucketCheckpoints} {
		if tx.Bucket(name) != nil {
			if err := tx.DeleteBucket(name); err != nil {
				return false, fmt.Errorf("ledger: delete bucket %q: %w", name, err)
			}
		}
	}
	return false, putLayout(meta, layoutOneBucket)
}

func bucketTreeOrCheckpoints(cps bool) []byte {
	if cps {
		return bucketCheckpoints
	}
	return bucketTree
}

// CheckMove checks, writing nothing, that a file of an older layout can
// be moved in steps each committed apart (Move), and that the moved file
// will open: it refuses, naming the cause, what would stop a step after
// others were committed, or what CheckTree refuses in layout 3 and the
// file's own build refused too (so that a refused open leaves the file as
// that build left it). On a file of layout 2, moved in part or not at all:
//
//   - every key left can be moved (movedKey) to a key not taken;
//   - the checks of the layout-2 build's CheckTree: the head's leaf is the
//     head's entry hash, no node lies at or past the head, and the root at
//     the size of the latest checkpoint (by number) is that checkpoint's;
//   - nothing is stored at or past the head in the entries' bucket but
//     checkpoints of the head's size (beyondHead: CheckTree's check once
//     moved, which the layout-2 build made only at its next append).
//
// and reports steps true: such a file may be moved in steps. A file of
// layout 1, or made before the tree, is moved by a first step that
// rebuilds or rekeys the whole tree in one transaction; CheckMove then checks its tree's keys as
// rekeyTree does (layout 1) and reports steps false: such a file is best
// moved by Init, in the transaction that then runs CheckTree, so that a
// file CheckTree refuses is left as it was.
func CheckMove(tx *bbolt.Tx) (steps bool, err error) {
	entries, meta := tx.Bucket(bucketEntries), tx.Bucket(bucketMeta)
	if entries == nil || meta == nil {
		return false, nil
	}
	layout, err := treeLayout(meta)
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	tree := tx.Bucket(bucketTree)
	if layout != layoutOneBucket && tree == nil {
		if err := recordedOlder(entries, layout); err != nil {
			return false, err
		}
	}
	if layout == layoutOneBucket || tree == nil {
		return false, nil // current, or a ledger made before the tree: built whole
	}
	return layout != layoutLevelMajor, checkMove(tx, entries, meta, tree, layout)
}

// checkMove is CheckMove's check of a file of layout 1 or 2.
func checkMove(tx *bbolt.Tx, entries, meta, tree *bbolt.Bucket, layout int) error {
	n, head, err := readHead(meta)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	prev := movedSize(entries, meta)
	for _, cps := range []bool{false, true} {
		b := tx.Bucket(bucketTreeOrCheckpoints(cps))
		if b == nil {
			continue
		}
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if !cps && layout == layoutLevelMajor {
				// Rekeyed before it moves: rekeyTree's check.
				if _, ok := levelMajorID(k); !ok {
					return fmt.Errorf("ledger: rekey the Merkle tree to layout %d: key %x names no tree node (the database is unchanged; verify it with the build that wrote it)", layoutCompletion, k)
				}
				if v == nil {
					return fmt.Errorf("ledger: rekey the Merkle tree to layout %d: key %x holds a bucket, not a hash (the database is unchanged; verify it with the build that wrote it)", layoutCompletion, k)
				}
				continue
			}
			nk, err := movedKey(cps, k, v, &prev, n)
			if err == nil && entries.Get(nk) != nil {
				err = takenError(k, nk)
			}
			if err != nil {
				return err
			}
		}
	}
	if layout == layoutLevelMajor {
		return nil
	}
	if layout == layoutCompletion {
		if err := checkOtherLayout(tree, meta, false); err != nil {
			return err
		}
		// Nothing moved yet: the entries' bucket holds records only. A
		// key of a node's or a checkpoint's form there would sit among
		// the moved ones, where the moved file's open (CheckTree) reads
		// it as one.
		c := entries.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != 8 || v == nil {
				return fmt.Errorf("ledger: a malformed key %s in the %q bucket (the database is unchanged; verify it with the build that wrote it)", keyText(k), bucketEntries)
			}
		}
	}
	fail := func(format string, a ...any) error {
		return fmt.Errorf("ledger: the file does not match its latest checkpoint (the database is unchanged): "+format, a...)
	}
	if k, _ := tree.Cursor().Seek(seqKey(n)); k != nil {
		id, _ := completionID(k)
		return fail("%s is stored beyond the head's %d entries", nodeName(id), n)
	}
	if what := beyondHead(entries, n); what != "" {
		return fail("%s is stored beyond the head's %d entries", what, n)
	}
	if what := attachedBeyond(tx, n); what != "" {
		return fail("%s is stored beyond the head's %d entries", what, n)
	}
	// The latest checkpoint: the last in ledger_checkpoints, or, all
	// moved, the one recorded.
	var latest *StoredCheckpoint
	var num uint64
	var signed []byte
	if cps := tx.Bucket(bucketCheckpoints); cps != nil {
		var k []byte
		if k, signed = cps.Cursor().Last(); len(k) == 8 {
			num = binary.BigEndian.Uint64(k)
		}
	}
	if signed == nil && layout == layoutMoving {
		if k := meta.Get(keyLastCheckpoint); k != nil {
			_, num, _ = parseCheckpointKey(k)
			signed = entries.Get(k)
		}
	}
	if signed != nil {
		note, err := loadCheckpoint(signed)
		if err != nil {
			return fail("latest checkpoint #%d: %v", num, err)
		}
		cp, _, err := parseSigned(note)
		if err != nil {
			return fail("latest checkpoint #%d: %v", num, err)
		}
		latest = &StoredCheckpoint{Num: num, Checkpoint: cp}
	}
	if err := checkEdge(storedTree{b: tree, moved: entries}, n, head, latest); err != nil {
		return fail("%v", err)
	}
	return nil
}

func takenError(k, nk []byte) error {
	return fmt.Errorf("ledger: move key %x: its key in %q, %x, is taken (verify it with the build that wrote it)", k, bucketEntries, nk)
}

// movedSize returns the size of the checkpoint moved last by an earlier
// step (keyLastCheckpoint), or 0: a record that names no moved checkpoint
// (before the first step, a layout-2 file has none) is not one.
func movedSize(entries, meta *bbolt.Bucket) uint64 {
	k := meta.Get(keyLastCheckpoint)
	if size, _, ok := parseCheckpointKey(k); ok && entries.Get(k) != nil {
		return size
	}
	return 0
}

// movedKey returns the layoutOneBucket key of the tree node (cps false) or
// checkpoint stored under k with value v in layout 2, in a ledger of n
// entries: a node keeps its key, which must name one; checkpoint #num goes
// under its size, which *prev then holds. A checkpoint whose size cannot
// key it — its note does not unpack or parse, or states a size below the
// checkpoint's before it or beyond the entries (damage or tampering that
// the layout-2 build opened, and its Verify named) — goes under the size
// of the one before it (*prev), its number kept: the keys then ascend
// with the numbers as the layout-2 build stored them, nothing lies beyond
// the head, and Verify names that checkpoint, as it did. A key that is no
// 8-byte number, or a nested bucket, cannot be moved.
func movedKey(cps bool, k, v []byte, prev *uint64, n uint64) ([]byte, error) {
	if !cps {
		if kindOf(k) != kindNode || v == nil {
			return nil, fmt.Errorf("ledger: move the Merkle tree into the %q bucket: key %x names no tree node (the database is unchanged; verify it with the build that wrote it)", bucketEntries, k)
		}
		return k, nil
	}
	if len(k) != 8 || v == nil {
		return nil, fmt.Errorf("ledger: move the checkpoints into the %q bucket: malformed checkpoint key %x (the database is unchanged; verify it with the build that wrote it)", bucketEntries, k)
	}
	if signed, err := loadCheckpoint(v); err == nil {
		if c, _, err := parseSigned(signed); err == nil && c.Size >= *prev && c.Size <= n {
			*prev = c.Size
		}
	}
	return checkpointKey(*prev, binary.BigEndian.Uint64(k)), nil
}

// checkLatestRecord compares the latest checkpoint's key that meta
// records with the last checkpoint key stored, found from the end of the
// bucket (past the entries appended since it, none in a kernel's file,
// whose every commit ends with a checkpoint): a stale record would number
// the next checkpoint as one already stored.
func checkLatestRecord(entries, meta *bbolt.Bucket) error {
	recorded := meta.Get(keyLastCheckpoint)
	var last []byte
	c := entries.Cursor()
	for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
		if kindOf(k) == kindCheckpoint {
			last = k
			break
		}
	}
	if !bytes.Equal(recorded, last) {
		return fmt.Errorf("the latest checkpoint's key recorded in the metadata (%q) is %x, the last stored checkpoint's is %x", keyLastCheckpoint, recorded, last)
	}
	return nil
}

// CheckLayout returns nil when tx's file is in the current key layout, or
// has no ledger yet, and else an error that says how to move it (readers
// refuse older files: see Move).
func CheckLayout(tx *bbolt.Tx) error {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return nil
	}
	if v := meta.Get(keyTreeLayout); len(v) == 1 && v[0] == layoutOneBucket {
		return nil
	}
	layout, err := treeLayout(meta)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if entries := tx.Bucket(bucketEntries); entries != nil {
		if err := recordedOlder(entries, layout); err != nil {
			return err
		}
	}
	return errOldLayout
}

// recordedOlder refuses an entries' bucket that holds the keys of layout
// 3 while ledger_meta records an older layout (or none) than one moved in
// part: only layout 3 has keys there that are not 8 bytes long, and one of
// them always sorts last (the latest checkpoint's, size||C0||num, or the
// head's node, completion||level, after the head's record). Such a file
// had its recorded layout changed; taken for an older one, it was rebuilt
// as one and refused with a misleading reason (an entry "missing"), or
// sent back to the kernel by the offline readers.
func recordedOlder(entries *bbolt.Bucket, layout int) error {
	if layout == layoutOneBucket || layout == layoutMoving {
		return nil
	}
	if k, _ := entries.Cursor().Last(); k != nil && len(k) != 8 {
		return fmt.Errorf("ledger: %w: ledger_meta records layout %02x (%q), but the keys of bucket %q are of layout 3 (last key %x): the meta key was changed; restore the data dir from a backup", ErrLayoutMismatch, layout, keyTreeLayout, bucketEntries, k)
	}
	return nil
}

// readsWhole reports whether the readers of the whole ledger (Verify,
// Export) read tx's file with its tree and checkpoints (layoutOneBucket)
// or as a hash chain alone (a ledger made before the tree and the
// checkpoints existed, not yet opened by Init); a file of another older
// layout is refused (errOldLayout).
func readsWhole(tx *bbolt.Tx, meta *bbolt.Bucket) (full bool, err error) {
	layout, err := treeLayout(meta)
	if err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	if layout == layoutOneBucket {
		return true, nil
	}
	if tx.Bucket(bucketTree) != nil || tx.Bucket(bucketCheckpoints) != nil {
		return false, errOldLayout
	}
	return false, nil
}

// errOldLayout is the error of a reader of a file Init has not migrated.
var errOldLayout = errors.New("ledger: the database is stored in an older layout (open it once with the kernel, whose Init moves it to the current one)")
