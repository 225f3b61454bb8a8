package kernel

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/txn"
)

// TestOverlongPathRefused: a path over 4096 bytes or 255 components, as
// an argument or an fs precondition ref, keyed or not, is refused
// invalid_args at step 5 (Resolve), before the policy and any lock, with
// a message naming its size and the limit, not the path. One at the
// limits passes step 5 (the policy decides it). Before,
// such a path reached the lock plan, whose ancestor walk was quadratic in
// its length (a 256 KiB path: 28 s of CPU).
func TestOverlongPathRefused(t *testing.T) {
	h := newHarness(t)
	long := strings.Repeat("a/", 2048) + "x"                                                   // 4097 bytes
	deep := strings.Repeat("a/", 255) + "x"                                                    // 256 components
	atLimits := strings.Repeat("b"+strings.Repeat("c", 30)+"/", 127) + strings.Repeat("d", 32) // 4096 bytes, 128 components
	atDepth := strings.Repeat("e/", 254) + "x"                                                 // 255 components
	ref := func(p string) func(*Envelope) {
		return func(e *Envelope) { e.PreconditionRefs = []txn.Precondition{{Ref: "fs:" + p, Absent: true}} }
	}
	cases := []struct {
		name, tool string
		path       string // the path argument
		mods       []func(*Envelope)
		class      string
		want       []string // in the message
	}{
		{"fs.read of 4097 bytes", "fs.read", long, nil, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"keyed fs.read of 4097 bytes", "fs.read", long, []func(*Envelope){key("long-read")}, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"fs.write of 256 components", "fs.write", deep, []func(*Envelope){key("deep-write")}, ErrInvalidArgs, []string{"256 components", "limit of 255 components"}},
		{"absolute fs.write of 4097 bytes", "fs.write", h.ws + "/" + long[len(h.ws)+1:], []func(*Envelope){key("abs-write")}, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"fs ref of 4097 bytes", "fs.read", "f.txt", []func(*Envelope){ref(long)}, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"keyed fs ref of 256 components", "fs.read", "f.txt", []func(*Envelope){key("deep-ref"), ref(deep)}, ErrInvalidArgs, []string{"256 components", "limit of 255 components"}},
		{"4096 bytes, absent", "fs.read", atLimits, []func(*Envelope){ref(atLimits)}, "", nil},
		{"255 components, absent", "fs.write", atDepth, []func(*Envelope){key("at-depth"), ref(atDepth)}, "", nil},
	}
	if len(long) != 4097 || len(atLimits) != 4096 {
		t.Fatalf("test paths of %d and %d bytes", len(long), len(atLimits))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := map[string]any{"path": tc.path}
			if tc.tool == "fs.write" {
				args["content"] = "x"
			}
			r := h.invoke(tc.tool, args, tc.mods...)
			if tc.class == "" {
				// At the limits: past step 5, decided by the policy.
				if errClass(r) == ErrInvalidArgs || len(r.RiskBasis) == 0 {
					t.Fatalf("%s %+v, basis %q: want a call the policy decided", errClass(r), r.Error, r.RiskBasis)
				}
				return
			}
			if errClass(r) != tc.class {
				t.Fatalf("%s %+v, want %s", errClass(r), r.Error, tc.class)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Error.Message, w) {
					t.Errorf("message %q does not say %q", r.Error.Message, w)
				}
			}
			if tc.want != nil && (len(r.Error.Message) > 200 || strings.Contains(r.Error.Message, "a/a/a/")) {
				t.Errorf("message of %d bytes holds the path: %.100q", len(r.Error.Message), r.Error.Message)
			}
		})
	}
}

// TestDeepRefsDoNotStopOtherWrites: a read-only call whose absent fs refs
// name more than MaxLockKeys paths and ancestors is refused before it
// locks anything, so another agent's write on its own root goes on while
// the call would have been running (a net.fetch its server holds); before,
// the call took every lock stripe shared and held them through the fetch,
// and the write waited for it. MaxPreconditions refs of ordinary depth
// run, holding their locks through the fetch, and a write none of them
// conflicts with goes on meanwhile.
func TestDeepRefsDoNotStopOtherWrites(t *testing.T) {
	h := newHarness(t)
	hits := make(chan chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held := make(chan struct{})
		select {
		case hits <- held:
			<-held
		case <-r.Context().Done():
		}
		fmt.Fprint(w, "slow")
	}))
	defer srv.Close()
	atok, ajti := h.mint("abuser", captoken.Capability{Tools: []string{"net.fetch"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "r"}}, Net: []string{"127.0.0.1"}})
	vws := t.TempDir()
	vtok, vjti := h.mint("victim", captoken.Capability{Tools: []string{"fs.write"}, FS: []captoken.FSRoot{{Path: vws, Mode: "rw"}}})
	realWS, realV := evalLinks(t, h.ws), evalLinks(t, vws)
	refs := func(rel func(i int) string) []string {
		var out []string
		for i := range MaxPreconditions {
			out = append(out, rel(i))
		}
		return out
	}
	cases := []struct {
		name    string
		refs    []string // absent, relative to the abuser's root
		refused bool
	}{
		// rev14's: 64 paths of 255 components, ~16,000 ancestors.
		{"deep refs", refs(func(i int) string { return fmt.Sprintf("p%d/", i) + strings.Repeat("a/", 253) + "x" }), true},
		// Each six directories below the root, in directories of its own
		// (the file's name is completed below).
		{"ordinary refs", refs(func(i int) string { return fmt.Sprintf("r%d/d1/d2/d3/d4/d5/f", i) }), false},
	}
	// Two unrelated keys may share a stripe. The ordinary refs' files are
	// ones whose stripes the victim's directories do not take, so that
	// the victim's file is free to choose (freeName).
	dirs := mustPlan(t, h.k.locks, []string{realV})
	dirs.exclusive = make([]bool, len(dirs.idx)) // shared, as a write's parents
	var keys []string
	for i, p := range cases[1].refs {
		for j := 0; ; j++ {
			q := fmt.Sprintf("%s%d", p, j)
			if !conflict(dirs, mustPlan(t, h.k.locks, append(keys, realWS+"/"+q))) {
				cases[1].refs[i], keys = q, append(keys, realWS+"/"+q)
				break
			}
		}
	}
	for n, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var pre []txn.Precondition
			for _, p := range tc.refs {
				pre = append(pre, txn.Precondition{Ref: "fs:" + p, Absent: true})
			}
			out := make(chan *Result, 1)
			go func() {
				out <- h.k.Invoke(context.Background(), h.env("net.fetch", map[string]any{"url": srv.URL + "/slow"}, func(e *Envelope) {
					e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "abuser", atok, ajti
					e.PreconditionRefs = pre
				}))
			}()
			var r *Result
			letGo := func() {}
			select {
			case held := <-hits: // the call runs, holding its locks
				letGo = sync.OnceFunc(func() { close(held) })
			case r = <-out:
			}
			defer letGo()
			running := r == nil
			switch {
			case tc.refused && running:
				t.Errorf("the call with %d refs of 255 components runs, holding its locks", len(tc.refs))
			case tc.refused && (errClass(r) != ErrInvalidArgs || !strings.Contains(r.Error.Message, fmt.Sprintf("more than %d paths and keys", MaxLockKeys))):
				t.Fatalf("%s %+v, want invalid_args over %d lock keys", errClass(r), r.Error, MaxLockKeys)
			case !tc.refused && !running:
				t.Fatalf("%s %+v, want the fetch to run", errClass(r), r.Error)
			}
			name := fmt.Sprintf("v%d.txt", n)
			if running && !tc.refused {
				name = freeName(t, h.k.locks, mustPlan(t, h.k.locks, keys), realV, n)
			}
			done := make(chan *Result, 1)
			go func() {
				done <- h.k.Invoke(context.Background(), h.env("fs.write", map[string]any{"path": name, "content": "x"}, key(fmt.Sprint("victim", n)), func(e *Envelope) {
					e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "victim", vtok, vjti
				}))
			}()
			select {
			case v := <-done:
				mustOK(t, v)
			case <-time.After(30 * time.Second):
				t.Fatal("the victim's write waited 30 s for the abuser's call")
			}
			if running {
				letGo()
				if r = <-out; !tc.refused {
					mustOK(t, r)
				}
			}
		})
	}
}

// evalLinks returns dir with its symlinks resolved, as lock keys are.
func evalLinks(t *testing.T, dir string) string {
	t.Helper()
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	return real
}

// freeName returns the name of a file in dir whose lock set shares no
// stripe with held (the first of v<n>-0.txt, v<n>-1.txt…).
func freeName(t *testing.T, l *pathLocks, held lockSet, dir string, n int) string {
	t.Helper()
	for i := range 1000 {
		name := fmt.Sprintf("v%d-%d.txt", n, i)
		if !conflict(held, mustPlan(t, l, []string{dir + "/" + name})) {
			return name
		}
	}
	t.Fatal("no file name whose stripes are free")
	return ""
}
