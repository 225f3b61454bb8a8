package txn

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/jsonpack"
	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/syscalls"
)

// env is a real store (bbolt) with the package's buckets and a workspace.
type env struct {
	t  *testing.T
	db *store.DB
	ws string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	dir := t.TempDir()
	db, err := store.Open(filepath.Join(dir, "k.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(context.Background(), func(tx *bbolt.Tx) error { return Init(tx) }); err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "ws")
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	return &env{t: t, db: db, ws: ws}
}

func (e *env) update(fn func(*bbolt.Tx) error) error {
	return e.db.Update(context.Background(), fn)
}

func (e *env) view(fn func(*bbolt.Tx) error) {
	e.t.Helper()
	if err := e.db.View(fn); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) write(rel, content string) {
	e.t.Helper()
	if err := os.WriteFile(filepath.Join(e.ws, rel), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

// read returns the content of rel, or "<absent>".
func (e *env) read(rel string) string {
	b, err := os.ReadFile(filepath.Join(e.ws, rel))
	if errors.Is(err, os.ErrNotExist) {
		return "<absent>"
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b)
}

func (e *env) prepare(p *Prepare) (json.RawMessage, error) {
	var replay json.RawMessage
	if err := p.Encode(); err != nil {
		return nil, err
	}
	err := e.update(func(tx *bbolt.Tx) error {
		var err error
		replay, err = p.Run(tx)
		return err
	})
	return replay, err
}

func newPrepare(op, key string) *Prepare {
	return &Prepare{
		Intent: Intent{OperationID: op, AgentID: "agent", IdemKey: key, TokenID: "tok", Reserved: Usage{BudgetCalls: 1}},
		Call:   Call{ToolID: "fs.write", ArgsHash: "h1", TokenID: "tok"},
	}
}

func (e *env) commit(in *Intent, effects []Effect, result string) string {
	e.t.Helper()
	id, delta, err := NewDelta(in.OperationID, effects)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.update(func(tx *bbolt.Tx) error {
		if err := CanCommit(tx, in, nil, nil, effects); err != nil {
			return err
		}
		if err := Spend(tx, in, effects); err != nil {
			return err
		}
		d, err := Decide(in, effects, id)
		if err != nil {
			return err
		}
		return Commit(tx, d, delta, []byte(result))
	}); err != nil {
		e.t.Fatal(err)
	}
	return id
}

func classOf(err error) string {
	var te *Error
	if errors.As(err, &te) {
		return te.Class
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return ""
}

func ptr(v uint64) *uint64 { return &v }

// TestPrepare: what Prepare refuses, replays or records, and that a
// refusal writes nothing.
func TestPrepare(t *testing.T) {
	cases := []struct {
		name   string
		setup  func(e *env) // run before the Prepare under test
		mod    func(p *Prepare)
		class  string
		replay string
	}{
		{name: "fresh key: intent recorded"},
		{name: "finished twin replays", setup: func(e *env) {
			p := newPrepare("op-0", "k")
			e.prepare(p)
			e.commit(&p.Intent, nil, `{"stored":true}`)
		}, replay: `{"stored":true}`},
		{name: "running twin is in flight", setup: func(e *env) { e.prepare(newPrepare("op-0", "k")) }, class: ClassInFlight},
		{name: "same key, other args", setup: func(e *env) { e.prepare(newPrepare("op-0", "k")) },
			mod: func(p *Prepare) { p.Call.ArgsHash = "h2" }, class: ClassConflict},
		{name: "operation id reused", setup: func(e *env) { e.prepare(newPrepare("op-1", "other")) }, class: ClassInvalidArgs},
		{name: "calls budget spent", setup: func(e *env) {
			e.update(func(tx *bbolt.Tx) error { return Charge(tx, []Account{{TokenID: "tok"}}, Usage{BudgetCalls: 1}, nil) })
		}, mod: func(p *Prepare) { p.Limits = Usage{BudgetCalls: 1} }, class: ClassBudget},
		{name: "kv precondition stale", mod: func(p *Prepare) {
			p.Preconditions = []Precondition{{Ref: "kv:cfg", Version: ptr(3)}}
		}, class: ClassPrecondition},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.setup != nil {
				tc.setup(e)
			}
			var before []Intent
			e.view(func(tx *bbolt.Tx) (err error) { before, err = Intents(tx); return })
			p := newPrepare("op-1", "k")
			if tc.mod != nil {
				tc.mod(p)
			}
			replay, err := e.prepare(p)
			if got := classOf(err); got != tc.class {
				t.Fatalf("class %q, want %q", got, tc.class)
			}
			if string(replay) != tc.replay {
				t.Fatalf("replay %s, want %s", replay, tc.replay)
			}
			var after []Intent
			e.view(func(tx *bbolt.Tx) (err error) { after, err = Intents(tx); return })
			if tc.class != "" || tc.replay != "" {
				if len(after) != len(before) {
					t.Fatalf("a refusal or replay wrote an intent: %d before, %d after", len(before), len(after))
				}
				return
			}
			if len(after) != 1 || after[0].OperationID != "op-1" || after[0].State != Prepared {
				t.Fatalf("intents after prepare: %+v", after)
			}
			e.view(func(tx *bbolt.Tx) error {
				if _, err := Lookup(tx, IdemKey{AgentID: "agent", Key: "k"}, p.Call); classOf(err) != ClassInFlight {
					t.Errorf("the key is not in flight after prepare: %v", err)
				}
				return nil
			})
		})
	}
}

// TestConflictMessageHidesArgsHash: a repeat of a key that differs from
// the key's first call is refused with a message naming the key and what
// differs, never the first call's args_hash. That hash is the plain BLAKE3
// of the first call's arguments: the refusal reaches the caller, the
// conflict's own audit record and its stored envelope, which outlive an
// erasure of the first call, and a short erased secret would be
// recovered from it by trying every value (rev-leaks #3).
func TestConflictMessageHidesArgsHash(t *testing.T) {
	first := Call{ToolID: "fs.write", ArgsHash: digest.Sum([]byte(`{"content":"4711","path":"pin.txt"}`)), TokenID: "tok"}
	cases := []struct {
		name string
		mod  func(c *Call)
		msg  string
	}{
		{"other tool", func(c *Call) { c.ToolID = "fs.delete" }, `idempotency key "k" was used for tool fs.write, not fs.delete`},
		{"other args", func(c *Call) { c.ArgsHash = digest.Sum([]byte(`{"content":"x","path":"pin.txt"}`)) }, `idempotency key "k" was used with other args`},
		{"other token", func(c *Call) { c.TokenID = "tok-2" }, `idempotency key "k" was used under capability token tok`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := newPrepare("op-0", "k")
			p.Call = first
			if _, err := e.prepare(p); err != nil {
				t.Fatal(err)
			}
			e.commit(&p.Intent, nil, `{"stored":true}`)
			again := first
			tc.mod(&again)
			e.view(func(tx *bbolt.Tx) error {
				_, err := Lookup(tx, IdemKey{AgentID: "agent", Key: "k"}, again)
				var te *Error
				if !errors.As(err, &te) || te.Class != ClassConflict || te.Message != tc.msg {
					t.Fatalf("repeat with %s: %v, want %s: %s", tc.name, err, ClassConflict, tc.msg)
				}
				if strings.Contains(te.Message, first.ArgsHash) {
					t.Fatalf("the refusal carries the first call's args_hash: %s", te.Message)
				}
				return nil
			})
		})
	}
}

// TestCommitAndRollback: a commit applies kv puts, stores the delta,
// numbers the commit, and makes the key replay its result; a rollback
// frees the key and releases the reservation except the call itself.
func TestCommitAndRollback(t *testing.T) {
	e := newEnv(t)
	var ids []string
	for i, op := range []string{"op-a", "op-b"} {
		p := newPrepare(op, "key-"+op)
		if _, err := e.prepare(p); err != nil {
			t.Fatal(err)
		}
		val := json.RawMessage(`{"n":` + string(rune('1'+i)) + `}`)
		effects := []Effect{{Op: OpKVPut, Key: "cfg", Value: val, Version: uint64(i + 1), NewHash: digest.Sum(val), Size: int64(len(val))}}
		ids = append(ids, e.commit(&p.Intent, effects, `{"op":"`+op+`"}`))
		if p.Intent.State != Decided || p.Intent.CommitSeq != uint64(i+1) {
			t.Fatalf("%s: state %s, commit seq %d; want decided, %d", op, p.Intent.State, p.Intent.CommitSeq, i+1)
		}
	}
	e.view(func(tx *bbolt.Tx) error {
		v, err := kvGet(tx, "cfg")
		if err != nil || v.Version != 2 || string(v.Value) != `{"n":2}` {
			t.Errorf("kv after two commits: %+v %v", v, err)
		}
		for _, id := range ids {
			if GetDelta(tx, id) == nil {
				t.Errorf("delta %s not stored", id)
			}
		}
		r, err := Lookup(tx, IdemKey{AgentID: "agent", Key: "key-op-a"}, Call{ToolID: "fs.write", ArgsHash: "h1", TokenID: "tok"})
		if err != nil || string(r) != `{"op":"op-a"}` {
			t.Errorf("replay of a committed key: %s %v", r, err)
		}
		return nil
	})
	// A commit whose kv version moved since staging is refused.
	p := newPrepare("op-c", "key-c")
	p.Intent.Reserved = Usage{BudgetCalls: 1, BudgetDiskWriteBytes: 100}
	if _, err := e.prepare(p); err != nil {
		t.Fatal(err)
	}
	stale := []Effect{{Op: OpKVPut, Key: "cfg", Value: json.RawMessage(`1`), Version: 2}}
	e.view(func(tx *bbolt.Tx) error {
		if err := CanCommit(tx, &p.Intent, nil, nil, stale); classOf(err) != ClassPrecondition {
			t.Errorf("CanCommit on a moved kv version: %v", err)
		}
		return nil
	})
	if err := e.update(func(tx *bbolt.Tx) error { return Rollback(tx, &p.Intent) }); err != nil {
		t.Fatal(err)
	}
	e.view(func(tx *bbolt.Tx) error {
		if r, err := Lookup(tx, IdemKey{AgentID: "agent", Key: "key-c"}, p.Call); r != nil || err != nil {
			t.Errorf("key after rollback: %s %v, want free", r, err)
		}
		ins, _ := Intents(tx)
		for _, in := range ins {
			if in.OperationID == "op-c" {
				t.Error("intent left after rollback")
			}
		}
		u, err := usageOf(tx, "tok")
		// The two kv values ({"n":1}, {"n":2}) are charged; op-c's
		// reservation is released.
		if err != nil || u[BudgetCalls] != 3 || u[BudgetDiskWriteBytes] != 14 {
			t.Errorf("usage after two commits and a rollback: %v %v, want 3 calls and 14 disk bytes", u, err)
		}
		return nil
	})
}

// stageFile writes a staging file for rel by hand and returns its write
// effect, staged against the content old ("" for a new file).
func (e *env) stageFile(op, rel, old, content string) Effect {
	e.t.Helper()
	stage := StagePrefix + op + "-0"
	e.write(stage, content)
	oldHash := ""
	if old != "" {
		oldHash = digest.Sum([]byte(old))
	}
	return Effect{Op: OpWrite, Root: e.ws, Path: rel, Stage: stage, OldHash: oldHash, NewHash: digest.Sum([]byte(content)), Size: int64(len(content))}
}

// TestRedo: recovery's apply renames a staged file only over its
// pre-image and only when it holds the committed content, deletes only
// the content it was staged against, and never leaves a staging file.
func TestRedo(t *testing.T) {
	// damaged stages content and then changes the staging file, as a lost
	// or torn write of it would.
	damaged := func(old string) func(e *env) Effect {
		return func(e *env) Effect {
			ef := e.stageFile("o", "f", old, "new")
			e.write(ef.Stage, "nex")
			return ef
		}
	}
	cases := []struct {
		name     string
		target   string // content before Redo; "" for absent
		effect   func(e *env) Effect
		want     string
		conflict string // the Conflict's Reason, "" for none
	}{
		{name: "new file", effect: func(e *env) Effect { return e.stageFile("o", "f", "", "new") }, want: "new"},
		{name: "target holds the pre-image", target: "old", effect: func(e *env) Effect { return e.stageFile("o", "f", "old", "new") }, want: "new"},
		{name: "already applied", target: "new", effect: func(e *env) Effect { return e.stageFile("o", "f", "old", "new") }, want: "new"},
		{name: "newer content is kept", target: "newer", effect: func(e *env) Effect { return e.stageFile("o", "f", "old", "new") }, want: "newer", conflict: ConflictTarget},
		{name: "new file, but one appeared", target: "other", effect: func(e *env) Effect { return e.stageFile("o", "f", "", "new") }, want: "other", conflict: ConflictTarget},
		{name: "staging file gone: renamed before", target: "new", effect: func(e *env) Effect {
			ef := e.stageFile("o", "f", "old", "new")
			os.Remove(filepath.Join(e.ws, ef.Stage))
			return ef
		}, want: "new"},
		{name: "delete of the pre-image", target: "old", effect: func(e *env) Effect {
			return Effect{Op: OpDelete, Root: e.ws, Path: "f", Stage: TrashPrefix + "o-0", OldHash: digest.Sum([]byte("old"))}
		}, want: "<absent>"},
		{name: "delete of changed content is not done", target: "changed", effect: func(e *env) Effect {
			return Effect{Op: OpDelete, Root: e.ws, Path: "f", Stage: TrashPrefix + "o-0", OldHash: digest.Sum([]byte("old"))}
		}, want: "changed", conflict: ConflictTarget},
		{name: "delete of a directory, a file there now", target: "other", effect: func(e *env) Effect {
			return Effect{Op: OpDelete, Root: e.ws, Path: "f", Stage: TrashPrefix + "o-0"}
		}, want: "other", conflict: ConflictTarget},
		{name: "damaged staging over the pre-image", target: "old", effect: damaged("old"), want: "old", conflict: ConflictStaging},
		{name: "damaged staging of a new file", effect: damaged(""), want: "<absent>", conflict: ConflictStaging},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			if tc.target != "" {
				e.write("f", tc.target)
			}
			ef := tc.effect(e)
			open, closeAll := OpenRoots()
			defer closeAll()
			conflicts, err := Redo("o", []Effect{ef}, open)
			if err != nil {
				t.Fatal(err)
			}
			if got := e.read("f"); got != tc.want {
				t.Errorf("f = %q, want %q", got, tc.want)
			}
			if tc.conflict == "" && len(conflicts) != 0 || tc.conflict != "" && (len(conflicts) != 1 || conflicts[0].Reason != tc.conflict) {
				t.Errorf("conflicts %+v, want reason %q", conflicts, tc.conflict)
			}
			if left, _ := stagingLeft(open, e.ws); len(left) != 0 {
				t.Errorf("staging left: %v", left)
			}
		})
	}
}

// TestRecover: decided intents are redone in commit order (the second
// commit of a path was staged on the first one's content, and its
// operation id sorts first), prepared ones are rolled back with their
// staging files removed, external ones are ended by the callback alone.
func TestRecover(t *testing.T) {
	e := newEnv(t)
	e.write("f", "v0")
	decide := func(op, old, content string) {
		p := newPrepare(op, "key-"+op)
		p.Intent.Dirs = []StageDir{{Root: e.ws, Dir: "."}}
		if _, err := e.prepare(p); err != nil {
			t.Fatal(err)
		}
		ef := e.stageFile(op, "f", old, content)
		e.commit(&p.Intent, []Effect{ef}, `{}`)
	}
	decide("op-z", "v0", "v1") // committed first
	decide("op-a", "v1", "v2") // committed second
	rolled := newPrepare("op-m", "key-m")
	rolled.Intent.Dirs = []StageDir{{Root: e.ws, Dir: "."}}
	ext := newPrepare("op-x", "key-x")
	ext.Intent.External = true
	for _, p := range []*Prepare{rolled, ext} {
		if _, err := e.prepare(p); err != nil {
			t.Fatal(err)
		}
	}
	e.write(StagePrefix+"op-m-0", "never")
	var ended []string
	rec, err := Recover(context.Background(), e.db, func(tx *bbolt.Tx, in *Intent) error {
		ended = append(ended, in.OperationID)
		if in.External {
			return Settle(tx, in, []byte(`{"unknown":true}`))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.read("f"); got != "v2" {
		t.Errorf("f = %q after recovery, want v2 (the commits applied in commit order)", got)
	}
	if len(rec.Redone) != 2 || rec.Redone[0].OperationID != "op-z" || len(rec.RolledBack) != 1 || len(rec.Unknown) != 1 || len(rec.Conflicts) != 0 {
		t.Errorf("recovered %+v", rec)
	}
	if strings.Join(ended, ",") != "op-m,op-x" {
		t.Errorf("callback for %v, want op-m and op-x", ended)
	}
	open, closeAll := OpenRoots()
	defer closeAll()
	if left, _ := stagingLeft(open, e.ws); len(left) != 0 {
		t.Errorf("staging left: %v", left)
	}
	e.view(func(tx *bbolt.Tx) error {
		if ins, _ := Intents(tx); len(ins) != 0 {
			t.Errorf("intents left: %+v", ins)
		}
		if r, err := Lookup(tx, IdemKey{AgentID: "agent", Key: "key-m"}, rolled.Call); r != nil || err != nil {
			t.Errorf("rolled-back key: %s %v, want free", r, err)
		}
		if r, _ := Lookup(tx, IdemKey{AgentID: "agent", Key: "key-x"}, ext.Call); string(r) != `{"unknown":true}` {
			t.Errorf("external key keeps %s, want its outcome_unknown result", r)
		}
		rep, err := VerifyWorkspace(tx, open)
		if err != nil || len(rep.Problems) != 0 || rep.Deltas != 2 {
			t.Errorf("workspace after recovery: %+v %v", rep, err)
		}
		return nil
	})
}

// TestRecoverDamagedStaging: a decided intent whose staging file was
// damaged before recovery (a lost write of it) is not applied over the
// target: recovery reports a staging_damaged conflict, leaves the target
// as it was, removes the staging file and ends the intent.
func TestRecoverDamagedStaging(t *testing.T) {
	e := newEnv(t)
	e.write("f", "v0")
	p := newPrepare("op-d", "key-d")
	p.Intent.Dirs = []StageDir{{Root: e.ws, Dir: "."}}
	if _, err := e.prepare(p); err != nil {
		t.Fatal(err)
	}
	ef := e.stageFile("op-d", "f", "v0", "v1")
	e.commit(&p.Intent, []Effect{ef}, `{}`)
	e.write(ef.Stage, "\x00\x00") // a write-back that never happened
	rec, err := Recover(context.Background(), e.db, func(*bbolt.Tx, *Intent) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if got := e.read("f"); got != "v0" {
		t.Errorf("f = %q after recovery, want v0 (the damaged staging file must not be renamed)", got)
	}
	want := Conflict{OperationID: "op-d", Op: OpWrite, Root: e.ws, Path: "f", Reason: ConflictStaging, Want: ef.NewHash, Found: digest.Sum([]byte("\x00\x00"))}
	if len(rec.Conflicts) != 1 || rec.Conflicts[0] != want || len(rec.Redone) != 1 {
		t.Errorf("recovered %+v, want the one conflict %+v", rec, want)
	}
	open, closeAll := OpenRoots()
	defer closeAll()
	if left, _ := stagingLeft(open, e.ws); len(left) != 0 {
		t.Errorf("staging left: %v", left)
	}
}

// stageRoot opens the workspace as a root and starts a Syncer, both
// closed when the test ends.
func (e *env) stageRoot(t *testing.T) (*os.Root, *Syncer) {
	t.Helper()
	root, err := os.OpenRoot(e.ws)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	syncer := NewSyncer()
	t.Cleanup(syncer.Close)
	return root, syncer
}

// TestStageDiscard: a discarded stage leaves no file and refuses more.
func TestStageDiscard(t *testing.T) {
	e := newEnv(t)
	root, syncer := e.stageRoot(t)
	s := NewStage("op", KV{View: e.db.View}, syncer)
	r := &syscalls.Resource{Root: root, RootPath: e.ws, Rel: "f"}
	if err := s.WriteFile(r, []byte("x"), 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Discard(); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(r, []byte("y"), 0); err == nil {
		t.Error("staging after Discard succeeded")
	}
	open, closeAll := OpenRoots()
	defer closeAll()
	if left, _ := stagingLeft(open, e.ws); len(left) != 0 || e.read("f") != "<absent>" {
		t.Errorf("after Discard: staging %v, f %q", left, e.read("f"))
	}
}

// TestStageOverFifo: staging a write over a fifo (put in the workspace by
// anyone) is refused at once, and so is checking a precondition on one:
// opening it for its old content blocked the call, its locks held, until
// a writer came.
func TestStageOverFifo(t *testing.T) {
	e := newEnv(t)
	if err := syscall.Mkfifo(filepath.Join(e.ws, "p"), 0o644); err != nil {
		t.Fatal(err)
	}
	root, syncer := e.stageRoot(t)
	s := NewStage("op", KV{View: e.db.View}, syncer)
	defer s.Discard()
	done := make(chan error, 1)
	go func() { done <- s.WriteFile(&syscalls.Resource{Root: root, RootPath: e.ws, Rel: "p"}, []byte("x"), 0) }()
	select {
	case err := <-done:
		if !errors.Is(err, errNotRegular) {
			t.Fatalf("WriteFile over a fifo: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WriteFile over a fifo blocked")
	}
}

// TestFileRoots: only staged file writes need a sync before the commit; a
// delete, a directory or a kv put stages nothing on disk.
func TestFileRoots(t *testing.T) {
	e := newEnv(t)
	e.write("old", "x")
	root, syncer := e.stageRoot(t)
	res := func(rel string) *syscalls.Resource { return &syscalls.Resource{Root: root, RootPath: e.ws, Rel: rel} }
	cases := []struct {
		name  string
		stage func(s *Stage) error
		files int
	}{
		{"nothing", func(s *Stage) error { return nil }, 0},
		{"delete", func(s *Stage) error { return s.Delete(res("old")) }, 0},
		{"mkdir", func(s *Stage) error { return s.Mkdir(res("d"), 0o755) }, 0},
		{"kv put", func(s *Stage) error { _, err := s.PutKV("k", json.RawMessage(`1`)); return err }, 0},
		{"write", func(s *Stage) error { return s.WriteFile(res("new"), []byte("y"), 0) }, 1},
		{"delete and two writes", func(s *Stage) error {
			return errors.Join(s.Delete(res("old")), s.WriteFile(res("a"), []byte("a"), 0), s.WriteFile(res("b"), []byte("b"), 0))
		}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := NewStage("op-"+strings.ReplaceAll(tc.name, " ", "-"), KV{View: e.db.View}, syncer)
			defer s.Discard()
			if err := tc.stage(s); err != nil {
				t.Fatal(err)
			}
			got := s.FileRoots()
			if len(got) != tc.files || len(got) == 1 && got[0] != root {
				t.Fatalf("FileRoots = %v, want %d (the stage's root)", got, tc.files)
			}
		})
	}
}

// TestOutcomeStoredOnce: a key's committed outcome is kept once — in the
// operations table when PutOperation stored the same envelope first — and
// every reader (Lookup, ForEachIdem, EraseResult) sees the same bytes
// whichever table holds them; an envelope the operations table does not
// hold (a lean copy of a read) stays with the key.
func TestOutcomeStoredOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		stored     string // what PutOperation stores before the commit ("" for nothing)
		result     string // the committed envelope
		keyHolds   bool   // the key's row keeps its own copy
		afterErase string
		json       bool // stored as JSON, as before envelopes were packed
	}{
		{"operation stored first", `{"op":"x","result":1}`, `{"op":"x","result":1}`, false, `{"op":"x"}`, false},
		{"operation stored first as JSON", `{"op":"x","result":1}`, `{"op":"x","result":1}`, false, `{"op":"x"}`, true},
		{"lean copy in the operations table", `{"op":"x"}`, `{"op":"x","result":1}`, true, `{"op":"x","erased":true}`, false},
		{"no operation stored", "", `{"op":"x","result":1}`, true, `{"op":"x"}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := newPrepare("op-x", "key-x")
			if _, err := e.prepare(p); err != nil {
				t.Fatal(err)
			}
			id, delta, err := NewDelta("op-x", nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.update(func(tx *bbolt.Tx) error {
				switch {
				case tc.json:
					if err := tx.Bucket(bucketOps).Put([]byte("op-x"), []byte(tc.stored)); err != nil {
						return err
					}
				case tc.stored != "":
					if err := PutOperation(tx, "op-x", PackOperation([]byte(tc.stored))); err != nil {
						return err
					}
					if v := tx.Bucket(bucketOps).Get([]byte("op-x")); v[0] != jsonpack.Tag {
						t.Errorf("operation stored as %q, not packed", v)
					}
				}
				d, err := Decide(&p.Intent, nil, id)
				if err != nil {
					return err
				}
				return Commit(tx, d, delta, []byte(tc.result))
			}); err != nil {
				t.Fatal(err)
			}
			k := IdemKey{AgentID: "agent", Key: "key-x"}
			check := func(want string) {
				t.Helper()
				e.view(func(tx *bbolt.Tx) error {
					var row idemRecord
					if err := json.Unmarshal(tx.Bucket(bucketIdem).Get(k.bytes()), &row); err != nil {
						t.Fatal(err)
					}
					if got := row.Result != nil; got != tc.keyHolds {
						t.Errorf("the key's row holds a copy: %v, want %v", got, tc.keyHolds)
					}
					r, err := Lookup(tx, k, p.Call)
					if err != nil || string(r) != want {
						t.Errorf("Lookup = %s, %v; want %s", r, err, want)
					}
					n := 0
					if err := ForEachIdem(tx, func(ie IdemEntry) error {
						n++
						if string(ie.Result) != want || !ie.Done {
							t.Errorf("ForEachIdem: %s (done %v), want %s", ie.Result, ie.Done, want)
						}
						return nil
					}); err != nil || n != 1 {
						t.Errorf("ForEachIdem: %d rows, %v", n, err)
					}
					return nil
				})
			}
			check(tc.result)
			// Erasure rewrites the operation's envelope, then the key's.
			if err := e.update(func(tx *bbolt.Tx) error {
				if tc.stored != "" && !tc.keyHolds {
					if err := PutOperation(tx, "op-x", PackOperation([]byte(tc.afterErase))); err != nil {
						return err
					}
				}
				return EraseResult(tx, k, "op-x", []byte(tc.afterErase))
			}); err != nil {
				t.Fatal(err)
			}
			check(tc.afterErase)
		})
	}
	// A row that refers to an operation the table lost is an error, never
	// an empty replay.
	e := newEnv(t)
	p := newPrepare("op-y", "key-y")
	if _, err := e.prepare(p); err != nil {
		t.Fatal(err)
	}
	id, delta, _ := NewDelta("op-y", nil)
	if err := e.update(func(tx *bbolt.Tx) error {
		if err := PutOperation(tx, "op-y", PackOperation([]byte(`{"op":"y"}`))); err != nil {
			return err
		}
		d, err := Decide(&p.Intent, nil, id)
		if err != nil {
			return err
		}
		if err := Commit(tx, d, delta, []byte(`{"op":"y"}`)); err != nil {
			return err
		}
		return tx.Bucket(bucketOps).Delete([]byte("op-y"))
	}); err != nil {
		t.Fatal(err)
	}
	e.view(func(tx *bbolt.Tx) error {
		if r, err := Lookup(tx, IdemKey{AgentID: "agent", Key: "key-y"}, p.Call); err == nil || !strings.Contains(err.Error(), "op-y") {
			t.Errorf("Lookup of a key whose operation is gone: %s, %v", r, err)
		}
		return nil
	})
}

// TestUndecodableOperation: a packed envelope that does not unpack is an
// error naming the operation, never other bytes.
func TestUndecodableOperation(t *testing.T) {
	e := newEnv(t)
	if err := e.update(func(tx *bbolt.Tx) error {
		op := PackOperation([]byte(`{"operation_id":"01900000-0000-7000-8000-000000000000","status":"ok"}`))
		return tx.Bucket(bucketOps).Put([]byte("op-z"), op.stored[:len(op.stored)-2])
	}); err != nil {
		t.Fatal(err)
	}
	e.view(func(tx *bbolt.Tx) error {
		if env, err := GetOperation(tx, "op-z"); err == nil || !strings.Contains(err.Error(), "op-z") {
			t.Errorf("GetOperation of a damaged envelope = %q, %v", env, err)
		}
		return nil
	})
}

// TestIntentEncodedOffTheTransaction: the intent Prepare.Encode and Decide
// encode before the transaction is stored as the intent itself — the
// prepared one with its state, the decided one with effects, delta and the
// commit sequence number assigned in the transaction.
func TestIntentEncodedOffTheTransaction(t *testing.T) {
	e := newEnv(t)
	stored := func(op string) Intent {
		t.Helper()
		var got Intent
		e.view(func(tx *bbolt.Tx) error {
			return json.Unmarshal(tx.Bucket(bucketIntent).Get([]byte(op)), &got)
		})
		return got
	}
	for i, op := range []string{"op-a", "op-b"} {
		p := newPrepare(op, "key-"+op)
		p.Intent.Audit = json.RawMessage(`{"tool_id":"fs.write"}`)
		p.Intent.Dirs = []StageDir{{Root: e.ws, Dir: "."}}
		if err := p.Encode(); err != nil {
			t.Fatal(err)
		}
		if _, err := e.prepare(p); err != nil {
			t.Fatal(err)
		}
		if got := stored(op); !reflect.DeepEqual(got, p.Intent) || got.State != Prepared {
			t.Fatalf("prepared intent stored %+v, want %+v", got, p.Intent)
		}
		effects := []Effect{{Op: OpWrite, Root: e.ws, Path: "f.txt", Stage: ".capk-stage-" + op + "-0", NewHash: digest.Sum([]byte("x")), Size: 1}}
		id := e.commit(&p.Intent, effects, `{"op":"`+op+`"}`)
		got := stored(op)
		if got.State != Decided || got.CommitSeq != uint64(i+1) || got.DeltaID != id || !reflect.DeepEqual(got.Effects, effects) {
			t.Fatalf("decided intent stored %+v", got)
		}
		if !reflect.DeepEqual(got, p.Intent) {
			t.Fatalf("decided intent stored %+v, want %+v", got, p.Intent)
		}
	}
}
