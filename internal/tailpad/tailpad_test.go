package tailpad

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"
)

// TestPadsFillPages: appending one ~900-byte value per transaction, a
// padded bucket holds four per 4 KiB page, an unpadded one two.
func TestPadsFillPages(t *testing.T) {
	for _, tc := range []struct {
		pad  bool
		want float64
	}{{false, 2}, {true, 4}} {
		t.Run(fmt.Sprintf("pad=%v", tc.pad), func(t *testing.T) {
			db, err := bbolt.Open(filepath.Join(t.TempDir(), "db"), 0o600, &bbolt.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if db.Info().PageSize != 4096 {
				t.Skip("page size is not 4 KiB")
			}
			const n = 400
			for i := range n {
				if err := db.Update(func(tx *bbolt.Tx) error {
					b, err := tx.CreateBucketIfNotExists([]byte("b"))
					if err != nil {
						return err
					}
					b.FillPercent = 1
					if tc.pad {
						if err := Ensure(b); err != nil {
							return err
						}
					}
					return b.Put(binary.BigEndian.AppendUint64(nil, uint64(i)), make([]byte, 900))
				}); err != nil {
					t.Fatal(err)
				}
			}
			db.View(func(tx *bbolt.Tx) error {
				st := tx.Bucket([]byte("b")).Stats()
				if got := float64(n) / float64(st.LeafPageN); got < tc.want-0.1 || got > tc.want+0.1 {
					t.Errorf("%.2f values per page, want %.0f", got, tc.want)
				}
				k, _ := tx.Bucket([]byte("b")).Cursor().Last()
				if tc.pad && !Is(k) {
					t.Errorf("last key %x is not a pad", k)
				}
				return nil
			})
		})
	}
	if Is([]byte("01900000-0000-7000-8000-000000000000")) || Is(binary.BigEndian.AppendUint64(nil, 1<<53)) {
		t.Fatal("a real key is a pad")
	}
}
