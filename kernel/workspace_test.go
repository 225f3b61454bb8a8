package kernel

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/capkernel/capkernel/txn"
)

// TestVerifyWorkspace: after writes, a patch, a delete and kv puts the
// workspace agrees with the committed deltas; each loss or change planted
// afterwards (the kind a failed rename left before fail stop) is named by
// path, and nothing else is.
func TestVerifyWorkspace(t *testing.T) {
	h := newHarness(t)
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "a1\n"}, key("a1")))
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "a.txt", "content": "a2\n"}, key("a2")))
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "b.txt", "content": "b\n"}, key("b")))
	mustOK(t, h.invoke("fs.patch", map[string]any{"path": "b.txt", "old": "b", "new": "B"}, key("bp")))
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "c.txt", "content": "c\n"}, key("c")))
	mustOK(t, h.invoke("fs.delete", map[string]any{"path": "c.txt"}, key("cd")))
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "keep.txt", "content": "k\n"}, key("k")))
	mustOK(t, h.invoke("kv.put", map[string]any{"key": "cfg", "value": map[string]any{"x": 1, "y": []int{1, 2}}}, key("kv1")))
	mustOK(t, h.invoke("kv.put", map[string]any{"key": "cfg", "value": 2}, key("kv2")))

	// A call is answered before its Finish commits (it rides in a later
	// transaction once the applied files are synced: store.UpdateLazy),
	// so the last calls are pending for a few milliseconds.
	var rep *txn.WorkspaceReport
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var err error
		if rep, err = h.k.VerifyWorkspace(); err != nil {
			t.Fatal(err)
		}
		if rep.Pending == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(rep.Problems) != 0 || rep.Pending != 0 || rep.Deltas != 9 || rep.Files != 4 || rep.Keys != 1 {
		t.Fatalf("clean workspace: %+v", rep)
	}

	plants := []struct {
		path  string
		plant func()
	}{
		{"a.txt", func() { h.write("a.txt", "a1\n") }},                            // an older version back
		{"b.txt", func() { os.Remove(filepath.Join(h.ws, "b.txt")) }},             // an acknowledged write lost
		{"c.txt", func() { h.write("c.txt", "c\n") }},                             // a delete undone
		{txn.StagePrefix + "x-0", func() { h.write(txn.StagePrefix+"x-0", "s") }}, // a staging file left
	}
	for _, p := range plants {
		p.plant()
	}
	rep, err := h.k.VerifyWorkspace()
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, p := range rep.Problems {
		named = append(named, p.Path)
	}
	slices.Sort(named)
	want := []string{txn.StagePrefix + "x-0", "a.txt", "b.txt", "c.txt"}
	if !slices.Equal(named, want) {
		t.Fatalf("problems name %v, want %v: %+v", named, want, rep.Problems)
	}
}
