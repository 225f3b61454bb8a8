package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/bbolt"
)

func openTest(t *testing.T) *DB {
	t.Helper()
	d, err := Open(filepath.Join(t.TempDir(), "s.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.Update(context.Background(), func(tx *bbolt.Tx) error {
		_, err := tx.CreateBucket([]byte("b"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return d
}

func put(k string) func(*bbolt.Tx) error {
	return func(tx *bbolt.Tx) error { return tx.Bucket([]byte("b")).Put([]byte(k), []byte("v")) }
}

func keys(t *testing.T, d *DB) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	d.View(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("b")).ForEach(func(k, _ []byte) error { out[string(k)] = true; return nil })
	})
	return out
}

// TestSequencerResultsAreTheirOwn: in concurrent batches, a refusal, an
// abort after a write and a panic each reach only their own caller; every
// other write commits.
func TestSequencerResultsAreTheirOwn(t *testing.T) {
	d := openTest(t)
	const n = 60
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprint("k", i)
			errs[i] = d.Update(context.Background(), func(tx *bbolt.Tx) error {
				switch i % 6 {
				case 1:
					return fmt.Errorf("refused %d", i)
				case 2:
					if err := put(k)(tx); err != nil {
						return err
					}
					return Abort(fmt.Errorf("aborted %d", i))
				case 3:
					put(k)(tx)
					panic("bug")
				}
				return put(k)(tx)
			})
		}()
	}
	wg.Wait()
	got := keys(t, d)
	for i := range n {
		k := fmt.Sprint("k", i)
		switch i % 6 {
		case 1, 2, 3:
			if errs[i] == nil || got[k] {
				t.Errorf("op %d: err %v, key written %v; want an error and no write", i, errs[i], got[k])
			}
		default:
			if errs[i] != nil || !got[k] {
				t.Errorf("op %d: err %v, key written %v; want success", i, errs[i], got[k])
			}
		}
	}
	if err := d.Update(context.Background(), put("after")); err != nil {
		t.Fatalf("sequencer dead after a panic: %v", err)
	}
}

// TestDoRunsWorkBetweenPrepareAndFinish: Work sees what Prepare computed,
// Finish sees Work's result, and a failing Work aborts only its op.
func TestDoRunsWorkBetweenPrepareAndFinish(t *testing.T) {
	d := openTest(t)
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var staged, worked string
			errs[i] = d.Do(context.Background(), Op{
				Prepare: func(tx *bbolt.Tx) error { staged = fmt.Sprint("p", i); return put(staged)(tx) },
				Work: func() error {
					if i == 7 {
						return errors.New("work failed")
					}
					worked = staged + "w"
					return nil
				},
				Finish: func(tx *bbolt.Tx) error { return put(worked)(tx) },
			})
		}()
	}
	wg.Wait()
	got := keys(t, d)
	for i := range 20 {
		if i == 7 {
			if errs[i] == nil || got["p7"] || got["p7w"] {
				t.Fatalf("failed Work: err %v, writes %v %v", errs[i], got["p7"], got["p7w"])
			}
			continue
		}
		if errs[i] != nil || !got[fmt.Sprint("p", i)] || !got[fmt.Sprint("p", i, "w")] {
			t.Fatalf("op %d: err %v", i, errs[i])
		}
	}
}

func TestCloseAndLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.db")
	d, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = Open(path, Options{OpenTimeout: 100 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "locked") || time.Since(start) > 5*time.Second {
		t.Fatalf("second open: %v after %v; want a fast 'locked' error", err, time.Since(start))
	}
	done := false
	d.UpdateAsync(func(tx *bbolt.Tx) error { done = true; return nil })
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if !done {
		t.Fatal("Close did not wait for a queued async write")
	}
	if err := d.Update(context.Background(), put("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Update after Close: %v, want ErrClosed", err)
	}
}
