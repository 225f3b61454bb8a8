package kernel

import (
	"testing"
	"time"
)

// TestPathLocksOnWait: a call that must wait for a stripe another call
// holds runs onWait first (the kernel hurries the syncs a finished call
// holds its locks for); one that finds its stripes free does not.
func TestPathLocksOnWait(t *testing.T) {
	cases := []struct {
		name       string
		held, want []string
		waits      bool
	}{
		{"same file", []string{"/ws/a.txt"}, []string{"/ws/a.txt"}, true},
		{"file under a held directory", []string{"/ws/d"}, []string{"/ws/d/a.txt"}, true},
		{"disjoint files", []string{"/ws/a.txt"}, []string{"/ws/b.txt"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newPathLocks()
			waited := make(chan struct{}, 1)
			l.onWait = func() { waited <- struct{}{} }
			held := l.plan(tc.held, nil)
			want := l.plan(tc.want, nil)
			if !tc.waits && conflict(held, want) {
				t.Skip("the two keys hash onto one stripe")
			}
			l.lock(held)
			got := make(chan struct{})
			go func() { l.lock(want); close(got) }()
			if tc.waits {
				select {
				case <-waited:
				case <-time.After(10 * time.Second):
					t.Fatal("a call waiting for a held stripe did not run onWait")
				}
				l.unlock(held)
				<-got
			} else {
				<-got
				l.unlock(held)
				select {
				case <-waited:
					t.Fatal("onWait ran for free stripes")
				default:
				}
			}
			l.unlock(want)
		})
	}
}

// conflict reports whether a and b share a stripe that one of them takes
// exclusively.
func conflict(a, b lockSet) bool {
	for n, i := range a.idx {
		for m, j := range b.idx {
			if i == j && (a.exclusive[n] || b.exclusive[m]) {
				return true
			}
		}
	}
	return false
}
