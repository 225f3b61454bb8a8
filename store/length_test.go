package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"
)

// A file cut short is refused by name, at any length from its two meta
// pages on, before bbolt touches a page past its end; a whole one opens.
// With MustExist a missing or empty file is refused, not made anew.
func TestOpenRefusesShortOrMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.db")
	d, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		if err := d.Update(t.Context(), func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("b"))
			if err != nil {
				return err
			}
			return b.Put(fmt.Appendf(nil, "%08d", i), make([]byte, 700))
		}); err != nil {
			t.Fatal(err)
		}
	}
	var used int64
	d.View(func(tx *bbolt.Tx) error { used = tx.Size(); return nil })
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := int64(os.Getpagesize())
	for _, n := range []int64{2 * page, 3 * page, used / 2, used - page, used - 1} {
		if err := os.WriteFile(path, whole[:n], 0o600); err != nil {
			t.Fatal(err)
		}
		if d, err := Open(path, Options{MustExist: true}); !errors.Is(err, ErrTruncated) {
			if err == nil {
				d.Close()
			}
			t.Fatalf("cut to %d of %d bytes: %v, want ErrTruncated", n, used, err)
		}
	}
	if err := os.WriteFile(path, whole[:used], 0o600); err != nil {
		t.Fatal(err)
	}
	d, err = Open(path, Options{MustExist: true})
	if err != nil {
		t.Fatalf("the file cut at its high-water mark: %v", err)
	}
	d.Close()
	for name, prepare := range map[string]func() error{
		"missing": func() error { return os.Remove(path) },
		"empty":   func() error { return os.WriteFile(path, nil, 0o600) },
	} {
		if err := prepare(); err != nil {
			t.Fatal(err)
		}
		if d, err := Open(path, Options{MustExist: true}); !errors.Is(err, ErrNoFile) {
			if err == nil {
				d.Close()
			}
			t.Fatalf("%s file: %v, want ErrNoFile", name, err)
		}
		if fi, err := os.Stat(path); name == "missing" && err == nil || name == "empty" && (err != nil || fi.Size() != 0) {
			t.Fatalf("%s file: Open changed it (%v, %v)", name, fi, err)
		}
	}
}
