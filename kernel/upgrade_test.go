package kernel

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
)

// servedHistory is what a data dir serves of its ledger, whatever its layout:
// the export (entries and checkpoints, byte for byte) and every entry as
// an auditor reads it, payloads included, one JSON line each.
func servedHistory(t *testing.T, in *Inspector) (export []byte, views []byte) {
	t.Helper()
	var b bytes.Buffer
	if err := in.Export(&b); err != nil {
		t.Fatal(err)
	}
	vs, err := in.EntryViews(0, 1<<20, AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		views = append(append(views, j...), '\n')
	}
	return b.Bytes(), views
}

// sameHistory reports whether a data dir that served export and views
// serves them still, followed by what was appended since (a reopened
// kernel appends records of its own).
func sameHistory(export, views, gotExport, gotViews []byte) bool {
	return len(views) > 0 && bytes.HasPrefix(gotExport, export) && bytes.HasPrefix(gotViews, views)
}

// upgradeHarness makes calls of several kinds (payloads of each size
// form, an erasure, a write), closes the kernel and returns what its data
// dir served.
func upgradeHarness(t *testing.T) (h *harness, export, views []byte) {
	h = newHarness(t)
	h.write("small.txt", "text")
	h.write("large.txt", benchText(t, 4096))
	for i := range 12 {
		mustOK(t, h.invoke("fs.read", map[string]any{"path": "small.txt"}))
		mustOK(t, h.invoke("fs.read", map[string]any{"path": "large.txt"}))
		mustOK(t, h.invoke("fs.write", map[string]any{"path": "w.txt", "content": strings.Repeat("w", i)}, key(strings.Repeat("k", i+1))))
	}
	r := h.invoke("echo", map[string]any{"text": "to be erased"})
	mustOK(t, r)
	if _, err := h.k.Erase(context.Background(), r.OperationID, "test"); err != nil {
		t.Fatal(err)
	}
	export, views = servedHistory(t, h.k.Inspector())
	h.k.Close()
	return h, export, views
}

// TestUpgradeFromLayout2: a data dir of the storage layout before layout
// 3 (tree, checkpoints and payloads in buckets of their own), or of the
// one before that (the tree keyed level-major), is refused by
// the offline inspector, saying what to do, and opened by the kernel in
// many small steps; it then serves exactly what it served before — the
// export byte for byte, every entry and payload — verifies, and takes
// new calls.
func TestUpgradeFromLayout2(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layout func(*testing.T, string)
	}{{"layout 2", toLayout2}, {"layout 1", toLayout1}} {
		t.Run(tc.name, func(t *testing.T) { testUpgrade(t, tc.layout) })
	}
}

func testUpgrade(t *testing.T, toLayout func(*testing.T, string)) {
	h, export, views := upgradeHarness(t)
	toLayout(t, h.data)
	if in, err := OpenInspector(h.data); err == nil {
		in.Close()
		t.Fatal("OpenInspector read a file of the older layout")
	} else if !strings.Contains(err.Error(), "older layout") {
		t.Fatalf("OpenInspector: %v", err)
	}
	defer func(n int) { upgradeStep = n }(upgradeStep)
	upgradeStep = 7
	h.open()
	gotExport, gotViews := servedHistory(t, h.k.Inspector())
	if !sameHistory(export, views, gotExport, gotViews) {
		t.Fatalf("after the upgrade the data dir serves other history:\nexport %d bytes, was %d\nviews %d bytes, was %d\n%s", len(gotExport), len(export), len(gotViews), len(views), firstDiff(gotExport, export))
	}
	mustVerify(t, h.k.Inspector())
	h.k.View(func(tx *bbolt.Tx) error {
		for _, name := range []string{"ledger_tree", "ledger_checkpoints"} {
			if tx.Bucket([]byte(name)) != nil {
				t.Errorf("bucket %s left after the upgrade", name)
			}
		}
		return ledger.CheckLayout(tx)
	})
	mustOK(t, h.invoke("fs.read", map[string]any{"path": "small.txt"}))
	mustVerify(t, h.k.Inspector())
}

// TestUpgradeInterrupted: a kernel stopped between the upgrade's steps —
// the ledger part moved, or all of it and some payloads — leaves a file
// the offline inspector refuses and the next Open finishes, serving what
// it served before.
func TestUpgradeInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ledgerSteps int
	}{
		{"after 3 steps", 3},
		{"after 6 steps", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, export, views := upgradeHarness(t)
			toLayout2(t, h.data)
			db, err := bbolt.Open(h.data+"/"+DBFile, 0o600, nil)
			if err != nil {
				t.Fatal(err)
			}
			step := func(f func(*bbolt.Tx, int) (bool, error), n int) {
				for i := 0; i < n; i++ {
					done := false
					if err := db.Update(func(tx *bbolt.Tx) error {
						var err error
						done, err = f(tx, 5)
						return err
					}); err != nil {
						t.Fatal(err)
					}
					if done {
						return
					}
				}
			}
			step(ledger.Move, tc.ledgerSteps)
			db.Close()
			if in, err := OpenInspector(h.data); err == nil {
				in.Close()
				t.Fatal("OpenInspector read a file moved in part")
			}
			h.open()
			gotExport, gotViews := servedHistory(t, h.k.Inspector())
			if !sameHistory(export, views, gotExport, gotViews) {
				t.Fatal("after the interrupted upgrade the data dir serves other history")
			}
			mustVerify(t, h.k.Inspector())
		})
	}
}

func firstDiff(a, b []byte) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return fmt.Sprintf("at %d: %q vs %q", i, a[max(0, i-80):min(len(a), i+80)], b[max(0, i-80):min(len(b), i+80)])
		}
	}
	return "one is a prefix of the other"
}

// TestUpgradeRefusedLeavesFile: a layout-2 data dir with a middle
// checkpoint's size damaged beyond the entries (which the layout-2 build
// opened, its open checking the latest checkpoint only) opens, the
// checkpoint moved under the size of the one before it, and verification
// names it; a data dir whose tree does not match its latest checkpoint
// (which the layout-2 build refused too) is refused before anything
// moves, the file left as it was.
func TestUpgradeRefusedLeavesFile(t *testing.T) {
	damage := func(t *testing.T, data string, fn func(tx *bbolt.Tx) error) {
		db, err := bbolt.Open(filepath.Join(data, DBFile), 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Update(fn); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("middle checkpoint's size", func(t *testing.T) {
		h, _, _ := upgradeHarness(t)
		key, err := LoadKey(filepath.Join(h.data, ReceiptKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		toLayout2(t, h.data)
		damage(t, h.data, func(tx *bbolt.Tx) error {
			s, err := ledger.NewCheckpointSigner(h.k.ID(), key)
			if err != nil {
				return err
			}
			signed, err := ledger.SignCheckpoint(s, ledger.Checkpoint{Origin: h.k.ID(), Size: 1 << 20})
			if err != nil {
				return err
			}
			return tx.Bucket([]byte("ledger_checkpoints")).Put(binary8(1), signed)
		})
		h.open()
		c, err := h.k.Inspector().Verify(nil)
		if err != nil || c.Intact || !strings.Contains(c.Reason, "checkpoint #1") {
			t.Fatalf("verify: %+v %v, want checkpoint #1 named", c, err)
		}
	})
	t.Run("payload past the head", func(t *testing.T) {
		// One flipped bit in a payload's key: the layout-2 build opened
		// it (its verification named it); the moved file's open would
		// refuse it, so the move is refused first.
		h, _, _ := upgradeHarness(t)
		toLayout2(t, h.data)
		damage(t, h.data, func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketPayloads).Put(binary8(1<<40), []byte("x"))
		})
		openRefusedUnchanged(t, h.data, "the attachment of entry 1099511627776 is stored beyond the head")
	})
	t.Run("tree past the latest checkpoint", func(t *testing.T) {
		h, _, _ := upgradeHarness(t)
		toLayout2(t, h.data)
		damage(t, h.data, func(tx *bbolt.Tx) error {
			hd := tx.Bucket([]byte("ledger_meta")).Get([]byte("head"))
			leaf := append(binary8(binary.BigEndian.Uint64(hd)-1), 0)
			return tx.Bucket([]byte("ledger_tree")).Put(leaf, make([]byte, 32))
		})
		openRefusedUnchanged(t, h.data, "upgrade the storage layout")
	})
}

// openRefusedUnchanged opens the data dir and wants it refused, with an
// error saying want, and its bbolt file left byte for byte as it was.
func openRefusedUnchanged(t *testing.T, data, want string) {
	t.Helper()
	before, err := os.ReadFile(filepath.Join(data, DBFile))
	if err != nil {
		t.Fatal(err)
	}
	if k, err := Open(context.Background(), Config{DataDir: data}); err == nil {
		k.Close()
		t.Fatalf("Open accepted the data dir; want it refused: %q", want)
	} else if !strings.Contains(err.Error(), want) {
		t.Fatalf("Open: %v, want %q", err, want)
	}
	after, err := os.ReadFile(filepath.Join(data, DBFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("the refused open changed the file")
	}
}
