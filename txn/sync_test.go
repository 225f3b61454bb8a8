package txn

import (
	"os"
	"testing"
	"time"
)

// TestSyncLater: a SyncLater request starts no round of its own; it is
// answered by the next round a Sync starts (one round for both), by a
// Hurry that comes before or after it, by its delay, or at Close.
func TestSyncLater(t *testing.T) {
	cases := []struct {
		name  string
		delay time.Duration
		run   func(s *Syncer, root *os.Root, later func())
	}{
		{"rides with the next Sync", time.Hour, func(s *Syncer, root *os.Root, later func()) {
			later()
			if err := s.Sync(root); err != nil {
				t.Error(err)
			}
		}},
		{"hurried after", time.Hour, func(s *Syncer, root *os.Root, later func()) { later(); s.Hurry() }},
		{"hurried before", time.Hour, func(s *Syncer, root *os.Root, later func()) { s.Hurry(); later() }},
		{"its delay", time.Millisecond, func(s *Syncer, root *os.Root, later func()) { later() }},
		{"at close", time.Hour, func(s *Syncer, root *os.Root, later func()) { later(); s.Close() }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, err := os.OpenRoot(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			s := NewSyncer()
			s.delay = tc.delay
			done := make(chan error, 1)
			tc.run(s, root, func() { s.SyncLater(func(err error) { done <- err }, root) })
			select {
			case err := <-done:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the SyncLater request was never answered")
			}
			if n := s.Rounds(); n != 1 {
				t.Fatalf("%d rounds, want 1", n)
			}
			if tc.name != "at close" {
				s.Close()
			}
		})
	}
}
