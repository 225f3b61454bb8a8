package kernel

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/internal/obstacles"
	"github.com/capkernel/capkernel/txn"
)

// callMaybeGated makes call tool with args under key; when gated, it
// approves the approval the call waits for (an escalation approver).
func (h *harness) callMaybeGated(gated bool, tool string, args map[string]any, k string) *Result {
	h.t.Helper()
	if !gated {
		return h.invoke(tool, args, key(k))
	}
	alice := h.approver("alice", captoken.RoleEscalation)
	a, res := h.gated(tool, args, key(k))
	if _, err := h.k.Decide(a.ID, alice, "allow", "ok"); err != nil {
		h.t.Fatal(err)
	}
	return <-res
}

// refusedBeforeCommit checks that r is a refusal before the commit of
// path for reason, audited once, and that the kernel goes on serving and
// starts again.
func (h *harness) refusedBeforeCommit(r *Result, path, reason string) {
	h.t.Helper()
	if r.Status != StatusError || r.TxOutcome != RolledBack || errClass(r) != ErrExecution ||
		!strings.Contains(r.Error.Message, path) || !strings.Contains(r.Error.Message, reason) ||
		!strings.Contains(r.Error.Message, "refused before the commit") {
		h.t.Fatalf("answer %s %s %+v: want execution_error, rolled_back, naming %s and %q", r.Status, r.TxOutcome, r.Error, path, reason)
	}
	if err := h.k.Err(); err != nil {
		h.t.Fatalf("the kernel failed stop: %v", err)
	}
	h.oneRecord(r.OperationID, RolledBack)
	mustOK(h.t, h.invoke("fs.write", map[string]any{"path": "after.txt", "content": "a"}, key("after-"+r.OperationID)))
	h.k.Close()
	h.open()
}

// TestApplyRefusedBeforeCommit: a call whose apply the file system would
// refuse for good is refused before its commit, rolled back with an
// error naming the path and the reason, audited once, and the kernel
// keeps serving (root kernel: mounts, read-only mounts, chattr +i). What
// a mount holds is kept. Before, each committed, failed stop at apply,
// and no later Open succeeded (rev-disk finding 1).
func TestApplyRefusedBeforeCommit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts and chattr")
	}
	cases := []struct {
		name   string
		exec   bool
		setup  func(t *testing.T, h *harness)
		gated  bool
		tool   string
		args   map[string]any
		path   string
		reason string
		keep   string // a file that must survive
	}{
		{name: "fs.write of a bind-mounted file", setup: func(t *testing.T, h *harness) {
			h.write("app.env", "")
			src := filepath.Join(t.TempDir(), "src.env")
			os.WriteFile(src, []byte("A=1\n"), 0o644)
			obstacles.Bind(t, h.ws, src, filepath.Join(h.ws, "app.env"), false)
		}, tool: "fs.write", args: map[string]any{"path": "app.env", "content": "A=2\n"}, path: "app.env", reason: "mount point"},
		{name: "fs.delete under a read-only bind mount", setup: func(t *testing.T, h *harness) {
			h.write("config/x.txt", "x")
			obstacles.ReadOnly(t, h.ws, filepath.Join(h.ws, "config"))
		}, tool: "fs.delete", args: map[string]any{"path": "config/x.txt"}, path: "config/x.txt", reason: "directory config is on a read-only file system", keep: "x.txt"},
		{name: "fs.delete of a mount point", setup: func(t *testing.T, h *harness) {
			obstacles.Tmpfs(t, h.ws, filepath.Join(h.ws, "mnt"))
			h.write("mnt/keep.txt", "on the mount")
		}, gated: true, tool: "fs.delete", args: map[string]any{"path": "mnt"}, path: "mnt", reason: "mount point", keep: "keep.txt"},
		{name: "fs.delete of a directory holding a mount", setup: func(t *testing.T, h *harness) {
			h.write("d/x.txt", "x")
			obstacles.Tmpfs(t, h.ws, filepath.Join(h.ws, "d/mnt"))
			h.write("d/mnt/keep.txt", "on the mount")
		}, gated: true, tool: "fs.delete", args: map[string]any{"path": "d"}, path: "d/mnt", reason: "mount point", keep: "keep.txt"},
		{name: "fs.delete of an immutable file", setup: func(t *testing.T, h *harness) {
			h.write("d/keep.txt", "precious")
			obstacles.Chattr(t, h.ws, "+i", filepath.Join(h.ws, "d/keep.txt"))
		}, tool: "fs.delete", args: map[string]any{"path": "d/keep.txt"}, path: "d/keep.txt", reason: "immutable", keep: "keep.txt"},
		{name: "fs.delete of a directory holding an immutable file", setup: func(t *testing.T, h *harness) {
			h.write("d/keep.txt", "precious")
			obstacles.Chattr(t, h.ws, "+i", filepath.Join(h.ws, "d/keep.txt"))
		}, gated: true, tool: "fs.delete", args: map[string]any{"path": "d"}, path: "d/keep.txt", reason: "immutable", keep: "keep.txt"},
		{name: "proc.exec writing under a mount", exec: true, setup: func(t *testing.T, h *harness) {
			obstacles.Tmpfs(t, h.ws, filepath.Join(h.ws, "mnt"))
		}, tool: "proc.exec", args: execArgs("sh", "-c", "echo x > mnt/new.txt"), path: "mnt/new.txt", reason: "another mount"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var h *harness
			if tc.exec {
				h = newExecHarness(t)
			} else {
				h = newHarness(t)
			}
			tc.setup(t, h)
			r := h.callMaybeGated(tc.gated, tc.tool, tc.args, "k")
			h.refusedBeforeCommit(r, tc.path, tc.reason)
			if tc.keep != "" && !fileUnder(h.ws, tc.keep) {
				t.Errorf("%s was removed", tc.keep)
			}
		})
	}
}

// fileUnder reports whether a file named name is anywhere under dir.
func fileUnder(dir, name string) bool {
	found := false
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		found = found || err == nil && d.Name() == name
		return nil
	})
	return found
}

// TestApplyRefusedAsNobody: a kernel that is not root refuses before the
// commit a delete in a directory it cannot write, and a write over
// another user's file in a sticky directory; it applies a proc.exec
// delta that makes a directory, fills it and makes it read-only. Before,
// each committed, failed stop, and no later Open succeeded.
func TestApplyRefusedAsNobody(t *testing.T) {
	t.Run("fs.delete in a read-only directory", func(t *testing.T) {
		if _, ok := obstacles.Nobody(t, nil); !ok {
			return
		}
		h := newHarness(t)
		h.write("ro/f.txt", "x")
		os.Chmod(filepath.Join(h.ws, "ro"), 0o555)
		t.Cleanup(func() { os.Chmod(filepath.Join(h.ws, "ro"), 0o755) })
		r := h.invoke("fs.delete", map[string]any{"path": "ro/f.txt"}, key("del"))
		h.refusedBeforeCommit(r, "ro/f.txt", "directory ro is not writable")
	})
	t.Run("fs.write over another user's file in a sticky directory", func(t *testing.T) {
		dir, ok := obstacles.Nobody(t, func(dir string) {
			shared := filepath.Join(dir, "shared")
			os.Mkdir(shared, 0o755)
			os.Chmod(shared, os.ModeSticky|0o777)
			os.WriteFile(filepath.Join(shared, "other.txt"), []byte("root's"), 0o666)
			os.Chmod(filepath.Join(shared, "other.txt"), 0o666)
		})
		if !ok {
			return
		}
		h := newHarness(t)
		h.ws = filepath.Join(dir, "shared")
		h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}})
		r := h.invoke("fs.write", map[string]any{"path": "other.txt", "content": "mine"}, key("w"))
		h.refusedBeforeCommit(r, "other.txt", "sticky")
		if got := h.read("other.txt"); got != "root's" {
			t.Errorf("other.txt = %q", got)
		}
	})
	t.Run("proc.exec making a read-only directory", func(t *testing.T) {
		if _, ok := obstacles.Nobody(t, nil); !ok {
			return
		}
		h := newExecHarness(t)
		t.Cleanup(func() { os.Chmod(filepath.Join(h.ws, "d"), 0o755) })
		r := h.invoke("proc.exec", execArgs("sh", "-c", "mkdir d && echo x > d/f && chmod 555 d"), key("exec"))
		mustOK(t, r)
		if got := h.read("d/f"); got != "x\n" {
			t.Errorf("d/f = %q", got)
		}
		if fi, err := os.Stat(filepath.Join(h.ws, "d")); err != nil || fi.Mode().Perm() != 0o555 {
			t.Errorf("d: %v %v, want mode 0555", fi.Mode(), err)
		}
		h.k.Close()
		h.open()
		mustVerifyWorkspace(t, h)
	})
}

func mustVerifyWorkspace(t *testing.T, h *harness) {
	t.Helper()
	rep, err := h.k.VerifyWorkspace()
	if err != nil || len(rep.Problems) != 0 {
		t.Fatalf("workspace check: %+v, %v", rep, err)
	}
}

// TestRecoveryRefusedApply: an obstacle that appears between the commit
// and the apply (set up at the "decided" crash point: a chattr +i of the
// target, a mount in a deleted directory) makes the kernel fail stop, as
// before, but the next Open succeeds: recovery reports the effect as an
// apply_refused conflict naming the errno, logs what it did not apply and
// why, applies the intent's other effects, keeps what the mount holds,
// and the workspace check names the path. Before, every Open failed.
func TestRecoveryRefusedApply(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts and chattr")
	}
	cases := []struct {
		name    string
		exec    bool
		before  map[string]string
		block   func(t *testing.T, h *harness)
		gated   bool
		tool    string
		args    map[string]any
		path    string
		errno   syscall.Errno
		keep    string
		landed  map[string]string // what the intent's other effects leave
		problem string            // the start of a path the workspace check names
	}{
		{name: "proc.exec rewriting an immutable file", exec: true, before: map[string]string{"f.txt": "old"},
			block: func(t *testing.T, h *harness) { obstacles.Chattr(t, h.ws, "+i", filepath.Join(h.ws, "f.txt")) },
			tool:  "proc.exec", args: execArgs("sh", "-c", "echo new > f.txt && echo g > g.txt"),
			path: "f.txt", errno: syscall.EPERM, landed: map[string]string{"f.txt": "old", "g.txt": "g\n"}, problem: "f.txt"},
		{name: "fs.delete of a directory that a mount appears in", before: map[string]string{"d/x.txt": "x"},
			block: func(t *testing.T, h *harness) {
				obstacles.Tmpfs(t, h.ws, filepath.Join(h.ws, "d/mnt"))
				h.write("d/mnt/keep.txt", "on the mount")
			},
			gated: true, tool: "fs.delete", args: map[string]any{"path": "d"}, path: "d", errno: syscall.EBUSY, keep: "keep.txt",
			problem: "d"}, // d is left, with the mount it holds
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var h *harness
			if tc.exec {
				h = newExecHarness(t)
			} else {
				h = newHarness(t)
			}
			for p, c := range tc.before {
				h.write(p, c)
			}
			crashHook = func(point string) {
				if point == "decided" {
					tc.block(t, h)
				}
			}
			defer func() { crashHook = nil }()
			r := h.callMaybeGated(tc.gated, tc.tool, tc.args, "k")
			crashHook = nil
			if r.TxOutcome != TxUnknown || h.k.Err() == nil {
				t.Fatalf("answer %s %s %+v, kernel error %v: want a fail stop", r.Status, r.TxOutcome, r.Error, h.k.Err())
			}
			h.k.Close()
			var log bytes.Buffer
			h.open(func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
			cs := h.k.Recovered.Conflicts
			if len(h.k.Recovered.Redone) != 1 || len(cs) != 1 || cs[0].Reason != txn.ConflictRefused || cs[0].Path != tc.path ||
				!strings.Contains(cs[0].Error, tc.errno.Error()) {
				t.Fatalf("recovered %+v, want one apply_refused conflict of %s with %q", h.k.Recovered, tc.path, tc.errno.Error())
			}
			if !strings.Contains(log.String(), "refuses it for good") || !strings.Contains(log.String(), tc.errno.Error()) ||
				!strings.Contains(log.String(), "path="+tc.path) {
				t.Errorf("recovery log %q does not say what was not applied and why", log.String())
			}
			for p, want := range tc.landed {
				if got := h.read(p); got != want {
					t.Errorf("%s = %q, want %q", p, got, want)
				}
			}
			if tc.keep != "" && !fileUnder(h.ws, tc.keep) {
				t.Errorf("%s, on the mount, was removed", tc.keep)
			}
			h.oneRecord(r.OperationID, Committed)
			rep, err := h.k.VerifyWorkspace()
			if err != nil || !hasProblem(rep, tc.problem) {
				t.Errorf("workspace check %+v, %v: want %s… named", rep, err, tc.problem)
			}
			mustOK(t, h.invoke("fs.write", map[string]any{"path": "later.txt", "content": "l"}, key("later")))
			h.k.Close()
			h.open()
			if n := len(h.k.Recovered.Redone) + len(h.k.Recovered.Conflicts); n != 0 {
				t.Errorf("second start recovered %+v, want nothing left", h.k.Recovered)
			}
		})
	}
}

// hasProblem reports whether rep names a path starting with prefix.
func hasProblem(rep *txn.WorkspaceReport, prefix string) bool {
	for _, p := range rep.Problems {
		if strings.HasPrefix(p.Path, prefix) {
			return true
		}
	}
	return false
}
