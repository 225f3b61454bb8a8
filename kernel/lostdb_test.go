package kernel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/store"
)

// TestLostDatabaseRefused: a data dir whose kernel.db is missing, empty
// or cut short is refused by Open and by the offline inspector, by name,
// and left as it was — never taken for a new kernel's, which would run
// committed calls again and forget revocations (rev10-disk #1, #3). Init
// makes the database; CreateDatabase makes one only where none is.
func TestLostDatabaseRefused(t *testing.T) {
	h := newHarness(t)
	h.write("a.txt", "a")
	for range 50 {
		mustOK(t, h.invoke("fs.read", map[string]any{"path": "a.txt"}))
	}
	h.k.Close()
	db := filepath.Join(h.data, DBFile)
	whole, err := os.ReadFile(db)
	if err != nil {
		t.Fatal(err)
	}
	var used int64 // the pages in use; bbolt grows the file ahead of them
	b, err := bbolt.Open(db, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	b.View(func(tx *bbolt.Tx) error { used = tx.Size(); return nil })
	b.Close()
	for _, tc := range []struct {
		name string
		make func() error
		want error
	}{
		{"missing", func() error { return os.Remove(db) }, store.ErrNoFile},
		{"empty", func() error { return os.WriteFile(db, nil, 0o600) }, store.ErrNoFile},
		{"cut to its meta pages", func() error { return os.WriteFile(db, whole[:2*os.Getpagesize()], 0o600) }, store.ErrTruncated},
		{"cut in the middle", func() error { return os.WriteFile(db, whole[:used/2], 0o600) }, store.ErrTruncated},
	} {
		if err := tc.make(); err != nil {
			t.Fatal(err)
		}
		before, _ := os.ReadFile(db)
		if k, err := Open(context.Background(), Config{DataDir: h.data}); !errors.Is(err, tc.want) {
			if err == nil {
				k.Close()
			}
			t.Fatalf("%s: Open: %v, want %v", tc.name, err, tc.want)
		} else if tc.want == store.ErrNoFile && !strings.Contains(err.Error(), "Restore kernel.db from a backup") {
			t.Fatalf("%s: Open: %v, want it to say to restore the file", tc.name, err)
		}
		if i, err := OpenInspector(h.data); err == nil {
			i.Close()
			t.Fatalf("%s: the inspector opened it", tc.name)
		}
		after, err := os.ReadFile(db)
		if tc.name == "missing" && !errors.Is(err, os.ErrNotExist) || tc.name != "missing" && string(after) != string(before) {
			t.Fatalf("%s: the refused opens changed the file (%d bytes, %v)", tc.name, len(after), err)
		}
	}
	if err := os.WriteFile(db, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := CreateDatabase(h.data); err == nil {
		t.Fatal("CreateDatabase over an existing kernel.db succeeded")
	}
	h.open()
	mustOK(t, h.invoke("fs.read", map[string]any{"path": "a.txt"}))
}

// TestOtherKernelsDatabaseRefused: a kernel.db from another kernel's data
// dir (its checkpoints under another origin, signed with another key) is
// refused by Open and left unchanged, where it was served and appended
// to; so is one whose latest checkpoint does not verify with this data
// dir's key (rev10-disk #5).
func TestOtherKernelsDatabaseRefused(t *testing.T) {
	mine, other := newHarness(t), newHarness(t)
	for _, h := range []*harness{mine, other} {
		h.write("a.txt", "a")
		mustOK(t, h.invoke("fs.read", map[string]any{"path": "a.txt"}))
		h.k.Close()
	}
	theirs, err := os.ReadFile(filepath.Join(other.data, DBFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mine.data, DBFile), theirs, 0o600); err != nil {
		t.Fatal(err)
	}
	openRefusedUnchanged(t, mine.data, "holds the ledger of kernel")
	// Same origin, another key: the key file swapped instead.
	if err := os.WriteFile(filepath.Join(other.data, DBFile), theirs, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{ReceiptKeyFile, ReceiptPublicKeyFile} {
		b, err := os.ReadFile(filepath.Join(mine.data, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(other.data, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	openRefusedUnchanged(t, other.data, "does not verify with this data dir's receipt key")
}

// TestLayoutRecordChanged: a layout-3 file whose recorded layout was
// changed to 02, or deleted, is refused by Open and by the offline
// inspector as a mismatch between its keys and its record (restore it),
// not taken for an older file to rebuild ("entry 1 missing") or to open
// with the kernel; and it is left unchanged (rev10-disk #6).
func TestLayoutRecordChanged(t *testing.T) {
	for name, change := range map[string]func(*bbolt.Bucket) error{
		"02":      func(m *bbolt.Bucket) error { return m.Put([]byte("tree_layout"), []byte{2}) },
		"deleted": func(m *bbolt.Bucket) error { return m.Delete([]byte("tree_layout")) },
	} {
		h := newHarness(t)
		h.write("a.txt", "a")
		for range 5 {
			mustOK(t, h.invoke("fs.read", map[string]any{"path": "a.txt"}))
		}
		h.k.Close()
		db, err := bbolt.Open(filepath.Join(h.data, DBFile), 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bbolt.Tx) error { return change(tx.Bucket([]byte("ledger_meta"))) }); err != nil {
			t.Fatal(err)
		}
		db.Close()
		openRefusedUnchanged(t, h.data, "the meta key was changed")
		if i, err := OpenInspector(h.data); err == nil || !strings.Contains(err.Error(), "the meta key was changed") {
			if err == nil {
				i.Close()
			}
			t.Fatalf("tree_layout %s: inspector: %v, want a layout mismatch", name, err)
		}
	}
}
