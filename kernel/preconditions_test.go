package kernel

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/txn"
)

// Precondition refs hold on every call that carries them: reads without an
// idempotency key (the direct path) as much as keyed or mutating calls.
func TestPreconditionsOnEveryCall(t *testing.T) {
	h := newHarness(t)
	h.write("notes.txt", "hi")
	mustOK(t, h.invoke("kv.put", map[string]any{"key": "cfg", "value": 1}, key("put-cfg")))
	good := digest.Sum([]byte("hi"))
	wrong := digest.Sum([]byte("not hi"))
	// head is the seq of the newest entry when the call is checked (a
	// checkpoint may follow a call, so it is read, not counted).
	head := func() string { return fmt.Sprintf(`{"ref":"ledger:head","seq":%d}`, h.headSize()-1) }
	calls := []struct {
		name  string
		tool  string
		args  map[string]any
		keyed bool
	}{
		{"fs.read", "fs.read", map[string]any{"path": "notes.txt"}, false},
		{"fs.stat", "fs.stat", map[string]any{"path": "notes.txt"}, false},
		{"kv.get", "kv.get", map[string]any{"key": "cfg"}, false},
		{"echo", "echo", map[string]any{"text": "x"}, false},
		{"keyed fs.read", "fs.read", map[string]any{"path": "notes.txt"}, true},
	}
	refs := []struct {
		name string
		ref  func() string
		ok   bool
	}{
		{"README example: wrong hash", func() string { return fmt.Sprintf(`{"ref":"fs:notes.txt","hash":%q}`, wrong) }, false},
		{"right hash", func() string { return fmt.Sprintf(`{"ref":"fs:notes.txt","hash":%q}`, good) }, true},
		{"absent on an existing file", func() string { return `{"ref":"fs:notes.txt","absent":true}` }, false},
		{"absent on a missing file", func() string { return `{"ref":"fs:missing.txt","absent":true}` }, true},
		{"hash of a missing file", func() string { return fmt.Sprintf(`{"ref":"fs:missing.txt","hash":%q}`, good) }, false},
		{"kv wrong version", func() string { return `{"ref":"kv:cfg","version":7}` }, false},
		{"kv right version", func() string { return `{"ref":"kv:cfg","version":1}` }, true},
		{"kv absent on a written key", func() string { return `{"ref":"kv:cfg","absent":true}` }, false},
		{"kv absent on a new key", func() string { return `{"ref":"kv:never","absent":true}` }, true},
		{"ledger head elsewhere", func() string { return `{"ref":"ledger:head","seq":0}` }, false},
		{"ledger head here", head, true},
	}
	n := 0
	for _, c := range calls {
		for _, rf := range refs {
			t.Run(c.name+"/"+rf.name, func(t *testing.T) {
				n++
				before := h.headSize()
				r := h.invoke(c.tool, c.args, func(e *Envelope) {
					e.PreconditionRefs = []txn.Precondition{mustPre(rf.ref())}
					if c.keyed {
						e.IdempotencyKey = fmt.Sprintf("keyed-%d", n)
					}
				})
				if rf.ok {
					mustOK(t, r)
				} else {
					if errClass(r) != ErrPreconditionFailed {
						t.Fatalf("class %q, want precondition_failed (%+v)", errClass(r), r.Error)
					}
					if r.Result != nil {
						t.Fatalf("a refused call returned a result: %s", r.Result)
					}
				}
				// Either way the call is in the ledger with its outcome.
				var found bool
				for _, a := range h.audits(before) {
					if a.OperationID == r.OperationID {
						found = true
					}
				}
				if !found {
					t.Fatalf("no audit record for operation %s", r.OperationID)
				}
			})
		}
	}
}

// A read checked against a file's hash returns that file's content, even
// while writers change it: the check and the read hold the same lock.
func TestPreconditionHeldThroughRead(t *testing.T) {
	h := newHarness(t)
	h.write("doc.txt", "v0")
	want := digest.Sum([]byte("v0"))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 40 {
			content := "v0"
			if i%2 == 0 {
				content = fmt.Sprintf("v%d", i+1)
			}
			r := h.invoke("fs.write", map[string]any{"path": "doc.txt", "content": content}, key(fmt.Sprintf("w%d", i)))
			if r.Status != StatusOK {
				t.Errorf("write %d: %+v", i, r.Error)
				return
			}
		}
	}()
	defer wg.Wait() // before the harness closes the kernel
	for range 80 {
		r := h.invoke("fs.read", map[string]any{"path": "doc.txt"}, func(e *Envelope) {
			e.PreconditionRefs = []txn.Precondition{mustPre(fmt.Sprintf(`{"ref":"fs:doc.txt","hash":%q}`, want))}
		})
		switch errClass(r) {
		case ErrPreconditionFailed:
		case "":
			var out struct {
				Content string `json:"content"`
			}
			if err := json.Unmarshal(r.Result, &out); err != nil {
				t.Fatal(err)
			}
			if out.Content != "v0" {
				t.Fatalf("read %q under a precondition on the hash of %q", out.Content, "v0")
			}
		default:
			t.Fatalf("read: %+v", r.Error)
		}
	}
}
