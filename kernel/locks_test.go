package kernel

import (
	"context"
	"fmt"
	"hash/maphash"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/txn"
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
			held := mustPlan(t, l, tc.held)
			want := mustPlan(t, l, tc.want)
			if !tc.waits && conflict(held, want) {
				t.Skip("the two keys hash onto one stripe")
			}
			l.lock(context.Background(), held)
			got := make(chan struct{})
			go func() { l.lock(context.Background(), want); close(got) }()
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

// TestPathLocksShareAndCancel: shared holders of a stripe hold it
// together and an exclusive one waits for both; a wait ends when its
// context does, giving back the stripes taken so far (a later call takes
// them at once) and leaving the held ones held.
func TestPathLocksShareAndCancel(t *testing.T) {
	l := newPathLocks()
	ctx := context.Background()
	dir := mustPlan(t, l, []string{"/ws/d"})                                         // d exclusive
	a, b := mustPlan(t, l, []string{"/ws/d/a"}), mustPlan(t, l, []string{"/ws/d/b"}) // d shared
	if conflict(a, b) {
		t.Skip("the two files hash onto one stripe")
	}
	if err := l.lock(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := l.lock(ctx, b); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := l.lock(short, dir); err != context.DeadlineExceeded {
		t.Fatalf("exclusive lock of a directory two calls hold shared: %v, want the deadline", err)
	}
	l.unlock(a)
	short2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if err := l.lock(short2, dir); err != context.DeadlineExceeded {
		t.Fatalf("exclusive lock while one shared holder remains: %v, want the deadline", err)
	}
	l.unlock(b)
	if err := l.lock(ctx, dir); err != nil {
		t.Fatalf("exclusive lock once both are gone: %v", err)
	}
	l.unlock(dir)

	// A two-stripe set whose second stripe is held: the first, taken
	// before the wait, is given back when the wait ends.
	x, y := mustPlan(t, l, []string{"/x"}), mustPlan(t, l, []string{"/y"})
	both := mustPlan(t, l, []string{"/x", "/y"})
	if len(both.idx) != 2 || conflict(x, y) {
		t.Skip("the two keys hash onto one stripe")
	}
	second := x
	if x.idx[0] == both.idx[0] {
		second = y
	}
	if err := l.lock(ctx, second); err != nil {
		t.Fatal(err)
	}
	short3, cancel3 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel3()
	if err := l.lock(short3, both); err != context.DeadlineExceeded {
		t.Fatalf("lock of a set with a held stripe: %v", err)
	}
	first := y
	if second.idx[0] == y.idx[0] {
		first = x
	}
	if !l.stripes[first.idx[0]].TryAcquire(stripeWeight) {
		t.Fatal("the stripe taken before the wait was not given back")
	}
	l.stripes[first.idx[0]].Release(stripeWeight)
	l.unlock(second)
}

// A call waiting for a path another call holds ends when it is cancelled,
// at once and while the path is still held, answered cancelled (not
// internal), audited, with nothing written and its key free; a read with
// a precondition waiting the same way ends alike.
func TestCancelWhileWaitingForLock(t *testing.T) {
	h := newHarness(t)
	h.write("c.txt", "old")
	real, err := filepath.EvalSymlinks(filepath.Join(h.ws, "c.txt"))
	if err != nil {
		t.Fatal(err)
	}
	held := mustPlan(t, h.k.locks, []string{real})
	if err := h.k.locks.lock(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	// Cancelled once it waits for the lock (not while the policy decides).
	waiting := make(chan struct{}, 1)
	hurry := h.k.locks.onWait
	h.k.locks.onWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
		hurry()
	}
	for _, tc := range []struct {
		name string
		env  *Envelope
	}{
		{"keyed write", h.env("fs.write", map[string]any{"path": "c.txt", "content": "new"}, key("c"))},
		{"read under a precondition", h.env("fs.read", map[string]any{"path": "c.txt"}, func(e *Envelope) {
			e.PreconditionRefs = []txn.Precondition{mustPre(`{"ref":"fs:c.txt","absent":true}`)}
		})},
	} {
		tc.env.OperationID = newID()
		before := h.headSize()
		out := make(chan *Result, 1)
		go func() { out <- h.k.Invoke(context.Background(), tc.env) }()
		select {
		case <-waiting:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: never waited for the held lock", tc.name)
		}
		if !h.k.Cancel(tc.env.OperationID, "") {
			t.Fatalf("%s: not in flight while it waits", tc.name)
		}
		var r *Result
		select {
		case r = <-out:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still waiting for the held lock 10 s after it was cancelled", tc.name)
		}
		if errClass(r) != ErrCancelled || r.TxOutcome != NoOp || !strings.Contains(r.Error.Message, "while it waited for its paths' locks") {
			t.Errorf("%s: %s %s %+v, want cancelled no_op while waiting for the locks", tc.name, errClass(r), r.TxOutcome, r.Error)
		}
		if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != ErrCancelled {
			t.Errorf("%s: audit records %+v, want one cancelled", tc.name, a)
		}
	}
	h.k.locks.unlock(held)
	if got := h.read("c.txt"); got != "old" {
		t.Fatalf("c.txt = %q", got)
	}
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "c.txt", "content": "new"}, key("c")))
	mustVerify(t, h.k.Inspector())
}

// mustPlan is l.plan of fsKeys, which must be within MaxLockKeys.
func mustPlan(t testing.TB, l *pathLocks, fsKeys []string) lockSet {
	t.Helper()
	s, err := l.plan(fsKeys, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPathLocksPlan: a plan takes each fs key exclusively and every
// ancestor of it shared, up to the top (not only within its root: a
// write through a nested root must wait for the outer root's command,
// which locks that root whole), and kv keys exclusively; the ancestors
// are those path.Dir gives, found in time linear in the key. More than
// MaxLockKeys keys, each counted once, are refused.
func TestPathLocksPlan(t *testing.T) {
	chain := func(n int) string { // a key with n-1 ancestors
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "/c%d", i)
		}
		return b.String()
	}
	refs := func(n int, f string) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf(f, i))
		}
		return out
	}
	cases := []struct {
		name         string
		fsKeys, kv   []string
		tooMany      bool
		conflictWith []string // fs keys whose plan must conflict with this one
	}{
		{name: "a file", fsKeys: []string{"/ws/d/a.txt"}, conflictWith: []string{"/ws/d", "/ws"}},
		{name: "a directory and a file in it", fsKeys: []string{"/ws/d", "/ws/d/a.txt"}, conflictWith: []string{"/ws/d/b.txt", "/ws"}},
		{name: "a file and its directory", fsKeys: []string{"/ws/d/a.txt", "/ws/d"}, conflictWith: []string{"/ws/d/b.txt", "/ws"}},
		{name: "a relative key", fsKeys: []string{"a/b/c"}, conflictWith: []string{"a/b", "a"}},
		{name: "a write in a nested root", fsKeys: []string{"/outer/a/inner/f"}, conflictWith: []string{"/outer", "/outer/a"}},
		{name: "kv keys", fsKeys: []string{"/ws/f"}, kv: []string{"kv:a", "kv:b"}, conflictWith: []string{"/ws"}},
		{name: "refs six directories down", fsKeys: refs(MaxPreconditions, "/home/u/ws/r%d/d1/d2/d3/d4/d5/f")},
		{name: "MaxLockKeys keys", fsKeys: []string{chain(MaxLockKeys)}},
		{name: "MaxLockKeys keys with kv", fsKeys: []string{chain(MaxLockKeys - 2)}, kv: []string{"kv:a", "kv:b"}},
		{name: "one key more", fsKeys: []string{chain(MaxLockKeys + 1)}, tooMany: true},
		{name: "one kv key more", fsKeys: []string{chain(MaxLockKeys - 1)}, kv: []string{"kv:a", "kv:b"}, tooMany: true},
		{name: "rev14's deep refs", fsKeys: refs(MaxPreconditions, "/ws/p%d/"+strings.Repeat("a/", 600)+"x"), tooMany: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newPathLocks()
			got, err := l.plan(tc.fsKeys, tc.kv)
			if tc.tooMany {
				if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("more than %d paths and keys", MaxLockKeys)) {
					t.Fatalf("plan of %d fs keys: %v, want refused over %d keys", len(tc.fsKeys), err, MaxLockKeys)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// The stripes path.Dir's ancestors take.
			modes := map[int]bool{}
			add := func(k string, excl bool) {
				i := int(maphash.String(l.seed, k) % uint64(len(l.stripes)))
				modes[i] = modes[i] || excl
			}
			for _, k := range tc.fsKeys {
				add(k, true)
				for d := path.Dir(k); d != "/" && d != "."; d = path.Dir(d) {
					add(d, false)
				}
			}
			for _, k := range tc.kv {
				add(k, true)
			}
			if len(got.idx) != len(modes) {
				t.Fatalf("%d stripes, want %d", len(got.idx), len(modes))
			}
			for n, i := range got.idx {
				if excl, ok := modes[i]; !ok || excl != got.exclusive[n] {
					t.Fatalf("stripe %d exclusive %v; want it %v (taken %v)", i, got.exclusive[n], excl, ok)
				}
			}
			for _, k := range tc.conflictWith {
				if !conflict(got, mustPlan(t, l, []string{k})) {
					t.Errorf("no conflict with a plan of %s", k)
				}
			}
		})
	}
}
