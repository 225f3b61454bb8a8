package ledger

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

// A flipped bit in a leaf page's element header (the top byte of a key's
// size, which then points 16 MiB past the element) is damage Verify
// reports as an error naming where it was, and that Export survives, not
// a fault that ends the process (rev10-disk #4: SIGBUS from ledger
// verify and export). Where the 16 MiB land in memory the process can
// read (another mapping after bbolt's), nothing faults and the key is
// read as a malformed one: Verify names it by its first bytes and length,
// where its message held the whole key in hex (33 MB).
func TestVerifyReportsFaultingPage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	db := openDB(t, path)
	appendN(t, db, 200)
	db.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := os.Getpagesize()
	flipped := false
	for p := 2; (p+1)*page <= len(raw) && !flipped; p++ {
		h := raw[p*page:]
		// A leaf (flags 0x02) of the entries: keys of 8 bytes.
		if binary.LittleEndian.Uint16(h[8:]) != 0x02 || binary.LittleEndian.Uint16(h[10:]) < 4 {
			continue
		}
		el := h[16+16*2:] // the third element: flags, pos, ksize, vsize
		if binary.LittleEndian.Uint32(el[8:]) != 8 {
			continue
		}
		el[11] ^= 1 // ksize += 16 MiB
		flipped = true
	}
	if !flipped {
		t.Fatal("no leaf page of 8-byte keys found to damage")
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	ro, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	ro.View(func(tx *bbolt.Tx) error {
		_, err := VerifyWith(tx, VerifyOptions{})
		if err == nil || !strings.Contains(err.Error(), "damaged") && !strings.Contains(err.Error(), "malformed key") {
			t.Errorf("Verify of the damaged file: %.300v, want the damage named", err)
		} else if len(err.Error()) > 1000 {
			t.Errorf("Verify's error is %d bytes long: %.300s…", len(err.Error()), err)
		}
		// Export writes what it can read of a damaged ledger (its own
		// verification names what is missing); it must not fault.
		_ = Export(tx, new(bytes.Buffer))
		return nil
	})
}
