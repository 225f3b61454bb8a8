package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"go.etcd.io/bbolt"
)

// Every put the floor server answers is in its file, once, however many
// were committed together.
func TestFloorCommits(t *testing.T) {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "floor.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	queue := make(chan floorPut, floorMaxBatch)
	go floorCommits(db, queue)
	defer close(queue)
	const n = 300
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := floorPut{body: fmt.Appendf(nil, "call %d", i), done: make(chan error, 1)}
			queue <- p
			if err := <-p.done; err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	seen := map[string]bool{}
	if err := db.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("calls")).ForEach(func(k, v []byte) error {
			if seen[string(v)] || !bytes.HasPrefix(v, []byte("call ")) {
				t.Errorf("key %x holds %q twice or unexpected", k, v)
			}
			seen[string(v)] = true
			return nil
		})
	}); err != nil {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("%d puts stored, want %d", len(seen), n)
	}
}
