package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// ErrTruncated is the error of a file shorter than its metadata says.
var ErrTruncated = errors.New("the file is shorter than its metadata says: truncated")

// bbolt's file format (version 2, frozen): two meta pages at the start,
// each a 16-byte page header, then the meta: magic, version, page size,
// flags (4 bytes each), the root bucket (16), the freelist's page id (8),
// the high-water mark — the number of pages in use, pgid (8) — the
// transaction id (8), and an FNV-64a checksum of the meta before it (8).
// Integers are in the machine's byte order (little-endian on the
// platforms capkernel builds for).
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	boltPageHeader   = 16
	boltMetaSize     = 64
	boltMetaSumStart = 56
)

// CheckLength refuses the bbolt file at path when it is shorter than the
// newest valid of its two meta pages says it is (page count × page size):
// a file cut short (a partial restore or copy, a file system that lost
// its tail). bbolt maps the file and would read the missing pages
// through the mapping, which faults (SIGBUS, a fatal runtime error no
// recover catches) wherever a page past the end is touched, and Open
// touches them all when it rebuilds the freelist. A file whose meta
// pages are both invalid is left to bbolt, which refuses it by name, as
// is a missing file.
func CheckLength(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("store: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	var best struct {
		txid, bytes uint64
		ok          bool
	}
	var pageSize uint64
	for i := range 2 {
		var b [boltPageHeader + boltMetaSize]byte
		if _, err := f.ReadAt(b[:], int64(i)*int64(pageSize)); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("store: %s: reading meta page %d: %w", path, i, err)
		}
		m := b[boltPageHeader:]
		le := binary.LittleEndian
		sum := fnv.New64a()
		sum.Write(m[:boltMetaSumStart])
		valid := le.Uint32(m[0:]) == boltMagic && le.Uint32(m[4:]) == boltVersion && le.Uint64(m[56:]) == sum.Sum64()
		if i == 0 {
			// The second meta page is one page on, whatever the first says
			// of itself: the page size the first records, when valid;
			// bbolt's default otherwise.
			pageSize = uint64(os.Getpagesize())
			if valid {
				pageSize = uint64(le.Uint32(m[8:]))
			}
		}
		if !valid {
			continue
		}
		if txid := le.Uint64(m[48:]); !best.ok || txid > best.txid {
			best.txid, best.bytes, best.ok = txid, le.Uint64(m[40:])*uint64(le.Uint32(m[8:])), true
		}
	}
	if best.ok && uint64(fi.Size()) < best.bytes {
		return fmt.Errorf("store: %s is %d bytes, but its metadata says %d: %w (restore it from a backup)", path, fi.Size(), best.bytes, ErrTruncated)
	}
	return nil
}
