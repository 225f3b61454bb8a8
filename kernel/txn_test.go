package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/bbolt"
	"golang.org/x/sys/unix"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

func TestIdempotency(t *testing.T) {
	h := newHarness(t)
	args := map[string]any{"path": "n.txt", "content": "one\n"}
	first := h.invoke("fs.write", args, key("k1"))
	mustOK(t, first)
	if first.TxOutcome != Committed || first.CommitDeltaID == "" || first.Replayed {
		t.Fatalf("first write: %+v", first)
	}
	// Someone else changes the file; a replay must not write again.
	h.write("n.txt", "changed by hand\n")
	again := h.invoke("fs.write", args, key("k1"))
	mustOK(t, again)
	if !again.Replayed || again.OperationID != first.OperationID || again.ResultHash != first.ResultHash || again.ReceiptID != first.ReceiptID || again.Receipt.Entry != first.Receipt.Entry {
		t.Fatalf("replay did not return the stored outcome: %+v", again)
	}
	if got := h.read("n.txt"); got != "changed by hand\n" {
		t.Fatalf("replay wrote again: %q", got)
	}
	other := h.invoke("fs.write", map[string]any{"path": "n.txt", "content": "two\n"}, key("k1"))
	if errClass(other) != ErrIdempotencyConflict {
		t.Fatalf("same key, other args: %q, want idempotency_conflict", errClass(other))
	}
	otherTool := h.invoke("fs.patch", map[string]any{"path": "n.txt", "old": "x", "new": "y"}, key("k1"))
	if errClass(otherTool) != ErrIdempotencyConflict {
		t.Fatalf("same key, other tool: %q, want idempotency_conflict", errClass(otherTool))
	}
	// The key is scoped to the agent: another agent's k1 is its own.
	tok, jti := h.mint("agent-2", captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
	r := h.invoke("fs.write", map[string]any{"path": "m.txt", "content": "m"}, key("k1"), func(e *Envelope) {
		e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "agent-2", tok, jti
	})
	mustOK(t, r)
	if r.Replayed {
		t.Fatal("another agent's key was replayed")
	}
	// Replays survive a restart.
	h.k.Close()
	h.open()
	again = h.invoke("fs.write", args, key("k1"))
	if !again.Replayed || again.OperationID != first.OperationID {
		t.Fatalf("replay after reopen: %+v", again)
	}
}

func TestIdempotencyRace(t *testing.T) {
	h := newHarness(t)
	const n = 50
	results := make([]*Result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = h.invoke("kv.put", map[string]any{"key": "counter", "value": 1}, key("once"))
		}()
	}
	wg.Wait()
	executed, replayed := 0, 0
	for _, r := range results {
		switch {
		case r.Status == StatusOK && !r.Replayed:
			executed++
		case r.Status == StatusOK && r.Replayed:
			replayed++
		case errClass(r) == ErrIdempotencyInFlight:
		default:
			t.Fatalf("unexpected result %+v", r.Error)
		}
	}
	if executed != 1 {
		t.Fatalf("%d executions, want exactly 1 (%d replays)", executed, replayed)
	}
	r := h.invoke("kv.get", map[string]any{"key": "counter"})
	var got struct{ Version uint64 }
	json.Unmarshal(r.Result, &got)
	if got.Version != 1 {
		t.Fatalf("kv version %d, want 1: the put ran more than once", got.Version)
	}
}

func TestStalePrecondition(t *testing.T) {
	h := newHarness(t)
	h.write("doc.txt", "v1")
	stale := digest.Sum([]byte("v0"))
	for _, c := range []struct {
		name string
		pre  string
	}{
		{"stale hash", fmt.Sprintf(`{"ref":"fs:doc.txt","hash":%q}`, stale)},
		{"expected absent", `{"ref":"fs:doc.txt","absent":true}`},
		{"kv version", `{"ref":"kv:cfg","version":3}`},
		{"ledger head", `{"ref":"ledger:head","seq":0}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := h.invoke("fs.write", map[string]any{"path": "doc.txt", "content": "v2"}, key("stale-"+c.name), func(e *Envelope) {
				e.PreconditionRefs = []txn.Precondition{mustPre(c.pre)}
			})
			if errClass(r) != ErrPreconditionFailed {
				t.Fatalf("class %q, want precondition_failed (%+v)", errClass(r), r.Error)
			}
			if got := h.read("doc.txt"); got != "v1" {
				t.Fatalf("workspace changed: %q", got)
			}
		})
	}
	assertNoStaging(t, h.ws)
	fresh := h.invoke("fs.write", map[string]any{"path": "doc.txt", "content": "v2"}, key("fresh"), func(e *Envelope) {
		e.PreconditionRefs = []txn.Precondition{mustPre(fmt.Sprintf(`{"ref":"fs:doc.txt","hash":%q}`, digest.Sum([]byte("v1"))))}
	})
	mustOK(t, fresh)
	if h.read("doc.txt") != "v2" {
		t.Fatal("fresh precondition: write not applied")
	}
}

// outcomes makes n calls concurrently, call(i) the i-th, and counts their
// results by error class ("" for ok).
func outcomes(n int, call func(i int) *Result) map[string]int {
	var wg sync.WaitGroup
	var mu sync.Mutex
	classes := map[string]int{}
	for i := range n {
		wg.Go(func() {
			c := errClass(call(i))
			mu.Lock()
			classes[c]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return classes
}

// budgetCall is the i-th call of a budget test under token use: a
// transactional kv.put when put(i), else a direct echo.
func (h *harness) budgetCall(i int, put bool, use func(*Envelope)) *Result {
	if put {
		return h.invoke("kv.put", map[string]any{"key": fmt.Sprint("k", i), "value": i}, key(fmt.Sprint("put-", i)), use)
	}
	return h.invoke("echo", map[string]any{"text": "x"}, use)
}

// tokensBeforeAndAfterRestart calls check with the kernel's tokens, then
// again once the kernel was closed and opened again on its data dir.
func (h *harness) tokensBeforeAndAfterRestart(t *testing.T, check func(when string, infos []TokenInfo)) {
	t.Helper()
	for _, when := range []string{"after the calls", "after a restart"} {
		if when == "after a restart" {
			h.k.Close()
			h.open()
		}
		infos, err := h.k.Tokens()
		if err != nil {
			t.Fatal(err)
		}
		check(when, infos)
	}
}

// TestBudgetUnderConcurrency: of 100 concurrent calls against a budget
// of 10 calls, which the store groups into few commits (the budget's
// charges coalesced in each), exactly 10 run, direct calls and
// transactional ones alike, and exactly 10 are stored, also across a
// restart.
func TestBudgetUnderConcurrency(t *testing.T) {
	for _, mixed := range []bool{false, true} {
		t.Run(fmt.Sprintf("transactional=%v", mixed), func(t *testing.T) {
			h := newHarness(t)
			tok, jti := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, KV: []captoken.KVScope{{Keys: "*", Mode: "rw"}},
				Budgets: map[string]int64{"calls": 10}})
			use := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = tok, jti }
			classes := outcomes(100, func(i int) *Result { return h.budgetCall(i, mixed && i%2 == 1, use) })
			if classes[""] != 10 || classes[ErrBudgetExceeded] != 90 {
				t.Fatalf("outcomes %v, want exactly 10 ok and 90 budget_exceeded", classes)
			}
			h.tokensBeforeAndAfterRestart(t, func(when string, infos []TokenInfo) {
				i := slices.IndexFunc(infos, func(ti TokenInfo) bool { return ti.ID == jti })
				if i < 0 || infos[i].Used["calls"] != 10 || infos[i].Left["calls"] != 0 {
					t.Fatalf("%s: token %s: %+v, want 10 calls used", when, jti, infos)
				}
			})
		})
	}
}

func TestDiskWriteBudget(t *testing.T) {
	h := newHarness(t)
	tok, jti := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}},
		Budgets: map[string]int64{"disk_write_bytes": 10}})
	use := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = tok, jti }
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "a", "content": "12345678"}, key("d1"), use))
	r := h.invoke("fs.write", map[string]any{"path": "b", "content": "123"}, key("d2"), use)
	if errClass(r) != ErrBudgetExceeded || r.TxOutcome != RolledBack {
		t.Fatalf("over the disk budget: %q %s", errClass(r), r.TxOutcome)
	}
	if _, err := os.Stat(filepath.Join(h.ws, "b")); !os.IsNotExist(err) {
		t.Fatal("over-budget write is visible")
	}
	assertNoStaging(t, h.ws)
}

// TestDiskWriteBudgetUnderConcurrency: 30 writes of 40 bytes at once, on a
// token with 100 bytes of disk_write_bytes, which the store groups into
// few commits: at most 2 commit, and the token is charged no more than
// its limit. Each call of a batch was checked against the usage from
// before the batch, its charge made in a later step: 15 committed, 600
// bytes (found by review).
func TestDiskWriteBudgetUnderConcurrency(t *testing.T) {
	h := newHarness(t)
	tok, jti := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}},
		Budgets: map[string]int64{"disk_write_bytes": 100}})
	use := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = tok, jti }
	classes := outcomes(30, func(i int) *Result {
		return h.invoke("fs.write", map[string]any{"path": fmt.Sprintf("f%d", i), "content": strings.Repeat("x", 40)}, key(fmt.Sprint("b", i)), use)
	})
	if classes[""] != 2 || classes[ErrBudgetExceeded] != 28 {
		t.Fatalf("outcomes %v, want 2 ok and 28 budget_exceeded", classes)
	}
	h.tokensBeforeAndAfterRestart(t, func(when string, infos []TokenInfo) {
		i := slices.IndexFunc(infos, func(ti TokenInfo) bool { return ti.ID == jti })
		if i < 0 || infos[i].Used["disk_write_bytes"] != 80 {
			t.Fatalf("%s: token %s: %+v, want 80 bytes used", when, jti, infos)
		}
	})
}

// TestParallelDisjointAndOverlapping: disjoint writes all commit; writes
// racing on one kv key serialize into distinct versions.
func TestParallelDisjointAndOverlapping(t *testing.T) {
	h := newHarness(t)
	var wg sync.WaitGroup
	versions := make([]uint64, 40)
	for i := range 40 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			mustOK(t, h.invoke("fs.write", map[string]any{"path": fmt.Sprintf("f%d.txt", i), "content": "x"}, key(fmt.Sprint("w", i))))
		}()
		go func() {
			defer wg.Done()
			r := h.invoke("kv.put", map[string]any{"key": "shared", "value": i}, key(fmt.Sprint("kv", i)))
			mustOK(t, r)
			var out struct{ Version uint64 }
			json.Unmarshal(r.Result, &out)
			versions[i] = out.Version
		}()
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for _, v := range versions {
		if v < 1 || v > 40 || seen[v] {
			t.Fatalf("versions %v are not 1..40 each once", versions)
		}
		seen[v] = true
	}
	mustVerify(t, h.k.Inspector())
}

func TestPatchAndDelete(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ApprovalTimeout = 50 * time.Millisecond })
	h.write("p.txt", "a b a")
	if r := h.invoke("fs.patch", map[string]any{"path": "p.txt", "old": "a", "new": "c"}, key("p0")); errClass(r) != ErrInvalidArgs || r.TxOutcome != RolledBack {
		t.Fatalf("ambiguous patch: %q %s", errClass(r), r.TxOutcome)
	}
	if r := h.invoke("fs.patch", map[string]any{"path": "p.txt", "old": "zzz", "new": "c"}, key("p1")); errClass(r) != ErrInvalidArgs {
		t.Fatalf("patch without match: %q", errClass(r))
	}
	mustOK(t, h.invoke("fs.patch", map[string]any{"path": "p.txt", "old": "b", "new": "B"}, key("p2")))
	if got := h.read("p.txt"); got != "a B a" {
		t.Fatalf("after patch: %q", got)
	}
	mustOK(t, h.invoke("fs.delete", map[string]any{"path": "p.txt"}, key("d")))
	if _, err := os.Stat(filepath.Join(h.ws, "p.txt")); !os.IsNotExist(err) {
		t.Fatal("deleted file still there")
	}
	h.write("dir/x", "x")
	r := h.invoke("fs.delete", map[string]any{"path": "dir"}, key("dd"))
	if errClass(r) != ErrApprovalTimeout || r.AutonomyMode != "escalated" {
		t.Fatalf("directory delete: %q %s, want approval_timeout escalated (nobody approved)", errClass(r), r.AutonomyMode)
	}
	if h.read("dir/x") != "x" {
		t.Fatal("the unapproved delete took effect")
	}
	assertNoStaging(t, h.ws)
}

func assertNoStaging(t *testing.T, ws string) {
	t.Helper()
	filepath.WalkDir(ws, func(p string, d os.DirEntry, err error) error {
		if err == nil && (strings.HasPrefix(d.Name(), txn.StagePrefix) || strings.HasPrefix(d.Name(), txn.TrashPrefix)) {
			t.Errorf("staging file left behind: %s", p)
		}
		return nil
	})
}

// TestCommitDeltaNamesStoredDelta: commit_delta_id is the digest of a
// stored delta that records path, old and new content hashes and size.
func TestCommitDeltaNamesStoredDelta(t *testing.T) {
	h := newHarness(t)
	h.write("d.txt", "old")
	r := h.invoke("fs.write", map[string]any{"path": "d.txt", "content": "new!"}, key("delta"))
	mustOK(t, r)
	var raw json.RawMessage
	h.k.View(func(tx *bbolt.Tx) error { raw = txn.GetDelta(tx, r.CommitDeltaID); return nil })
	if raw == nil || digest.Sum(raw) != r.CommitDeltaID {
		t.Fatalf("delta %s not stored under its digest: %s", r.CommitDeltaID, raw)
	}
	var d txn.Delta
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	c := d.Changes[0]
	if d.OperationID != r.OperationID || len(d.Changes) != 1 || c.Op != "write" || c.Path != "d.txt" ||
		c.OldHash != digest.Sum([]byte("old")) || c.NewHash != digest.Sum([]byte("new!")) || c.Size != 4 {
		t.Fatalf("delta %+v", d)
	}
}

// TestReplacedInodeNotReused: a process holding a workspace file by an
// O_PATH descriptor (which no lease or lock reports) still reaches the
// replaced content after writes to another workspace: a replaced inode
// is never reused as a staging file (docs/kernel.md, "No recycled
// inodes"). Reopening the descriptor through /proc must not read the
// other workspace's secret.
func TestReplacedInodeNotReused(t *testing.T) {
	h := newHarness(t)
	other := filepath.Join(filepath.Dir(h.ws), "other") // same file system
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	tok, jti := h.mint("agent-2", captoken.Capability{Tools: []string{"fs.write"}, FS: []captoken.FSRoot{{Path: other, Mode: "rw"}}})
	agent2 := func(e *Envelope) { e.AgentID, e.CapabilityToken, e.CapabilityTokenID = "agent-2", tok, jti }
	h.write("x.txt", "old x")
	fd, err := unix.Open(filepath.Join(h.ws, "x.txt"), unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "x.txt", "content": "new x"}, key("x")))
	h.k.finishing.Wait() // x.txt's replacement is durable
	for i := range 8 {
		mustOK(t, h.invoke("fs.write", map[string]any{"path": fmt.Sprintf("s%d.txt", i), "content": "secret"}, key(fmt.Sprint("s", i)), agent2))
		h.k.finishing.Wait()
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "old x" {
		t.Fatalf("the O_PATH holder of the replaced x.txt reads %q, want %q", b, "old x")
	}
}

// TestSharedParentBudgetUnderConcurrency: two tokens attenuated from one
// parent share its calls budget. 60 concurrent calls of both (direct ones
// and transactional kv.puts, mixed in the same group commits) run exactly
// the parent's limit, no child runs past its own, and the usage stored
// says so before and after a restart.
func TestSharedParentBudgetUnderConcurrency(t *testing.T) {
	h := newHarness(t)
	parent, _ := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, KV: []captoken.KVScope{{Keys: "*", Mode: "rw"}},
		Budgets: map[string]int64{"calls": 7}})
	kids := []*MintedToken{
		h.attenuate(AttenuateRequest{Parent: parent, Budgets: map[string]int64{"calls": 5}}),
		h.attenuate(AttenuateRequest{Parent: parent, Budgets: map[string]int64{"calls": 5}}),
	}
	classes := outcomes(60, func(i int) *Result { return h.budgetCall(i, i%3 == 0, as(kids[i%2])) })
	if classes[""] != 7 || classes[ErrBudgetExceeded] != 53 {
		t.Fatalf("outcomes by error class %v, want 7 ok and 53 %s", classes, ErrBudgetExceeded)
	}
	h.tokensBeforeAndAfterRestart(t, func(when string, infos []TokenInfo) {
		sum := int64(0)
		for _, k := range kids {
			j := slices.IndexFunc(infos, func(ti TokenInfo) bool { return ti.ID == k.ID })
			if j >= 0 {
				sum += infos[j].Used["calls"]
				if infos[j].Used["calls"] > 5 {
					t.Errorf("%s: child over its limit: %+v", when, infos[j])
				}
			}
		}
		if sum != 7 {
			t.Errorf("%s: the children used %d calls, want the parent's 7", when, sum)
		}
	})
}

// externalSys is test.external: a mutating syscall with an effect outside
// the kernel (Definition.External, not self-timed), counted in runs, that
// ends as its args say: "slow" waits out its timeout, "garbage" returns a
// result that is not a JSON object, "panic" panics.
type externalSys struct{ runs *atomic.Int32 }

func (externalSys) Definition() syscalls.Definition {
	return syscalls.Definition{
		ID: "test.external", Description: "acts elsewhere", SideEffect: syscalls.Write, External: true, Timeout: 50 * time.Millisecond,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"end":{"type":"string"}},"required":["end"]}`),
	}
}

func (e externalSys) Execute(ctx context.Context, c *syscalls.Call) (syscalls.Output, error) {
	e.runs.Add(1)
	var a struct{ End string }
	json.Unmarshal(c.Args, &a)
	switch a.End {
	case "slow":
		<-ctx.Done()
		return syscalls.Output{}, ctx.Err()
	case "garbage":
		return syscalls.Output{Result: json.RawMessage(`[1]`)}, nil
	}
	panic("test.external panics")
}

// TestExternalUnusableEndSettles: an external syscall that acted, or may
// have, but ended in a way the kernel cannot use (abandoned at its
// timeout, a result that is not an object, a panic) ends outcome_unknown
// with its key settled: a repeat is answered with that and does not run
// it again (the key used to be freed, and the repeat acted twice).
func TestExternalUnusableEndSettles(t *testing.T) {
	h := newHarness(t)
	var runs atomic.Int32
	if err := h.k.Registry().Register(func() syscalls.Syscall { return externalSys{&runs} }); err != nil {
		t.Fatal(err)
	}
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"test.*"}})
	for _, end := range []string{"slow", "garbage", "panic"} {
		t.Run(end, func(t *testing.T) {
			runs.Store(0)
			args := map[string]any{"end": end}
			first := h.invoke("test.external", args, key("ext-"+end))
			if errClass(first) != ErrOutcomeUnknown || first.TxOutcome != RolledBack {
				t.Fatalf("first: class %q, outcome %q (%+v); want outcome_unknown, rolled back", errClass(first), first.TxOutcome, first.Error)
			}
			again := h.invoke("test.external", args, key("ext-"+end))
			if !again.Replayed || again.OperationID != first.OperationID {
				t.Fatalf("repeat: %+v, want the first outcome replayed", again)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("ran %d times under one key, want 1", n)
			}
		})
	}
	if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) > 0 {
		t.Fatalf("replay verify: %v %+v", err, rep)
	}
}
