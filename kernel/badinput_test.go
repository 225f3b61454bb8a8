package kernel

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestBadInput: garbage gets a result with the right class and an audit
// record, and changes nothing else.
func TestBadInput(t *testing.T) {
	h := newHarness(t)
	h.write("keep.txt", "keep")
	valid := func(mod func(map[string]any)) []byte {
		m := map[string]any{
			"tool_id": "fs.write", "args": map[string]any{"path": "keep.txt", "content": "changed"},
			"agent_id": h.agent, "capability_token": h.token, "capability_token_id": h.jti,
			"policy_hash": h.k.PolicyHash(), "idempotency_key": "bad-input",
		}
		mod(m)
		b, _ := json.Marshal(m)
		return b
	}
	huge := strings.Repeat("x", 2<<20)
	cases := []struct {
		name  string
		raw   []byte
		class string
	}{
		{"empty", []byte{}, ErrInvalidArgs},
		{"not json", []byte("tool_id=fs.write"), ErrInvalidArgs},
		{"truncated", []byte(`{"tool_id":"fs.write","args":{`), ErrInvalidArgs},
		{"array", []byte(`[1,2,3]`), ErrInvalidArgs},
		{"trailing data", append(valid(func(map[string]any) {}), []byte(" {}")...), ErrInvalidArgs},
		{"unknown envelope field", valid(func(m map[string]any) { m["sudo"] = true }), ErrInvalidArgs},
		{"args wrong type", valid(func(m map[string]any) { m["args"] = "keep.txt" }), ErrInvalidArgs},
		{"args missing", valid(func(m map[string]any) { delete(m, "args") }), ErrInvalidArgs},
		{"tool_id wrong type", valid(func(m map[string]any) { m["tool_id"] = 7 }), ErrInvalidArgs},
		{"content wrong type", valid(func(m map[string]any) { m["args"] = map[string]any{"path": "keep.txt", "content": 7} }), ErrInvalidArgs},
		{"unknown arg", valid(func(m map[string]any) { m["args"] = map[string]any{"path": "keep.txt", "content": "x", "mode_evil": 1} }), ErrInvalidArgs},
		{"duplicate arg key", []byte(strings.Replace(string(valid(func(map[string]any) {})), `"content":"changed"`, `"content":"changed","content":"twice"`, 1)), ErrInvalidArgs},
		{"unknown tool", valid(func(m map[string]any) { m["tool_id"] = "fs.nuke" }), ErrToolNotFound},
		{"NUL in path", valid(func(m map[string]any) { m["args"] = map[string]any{"path": "keep.txt\x00", "content": "x"} }), ErrScopeDenied},
		{"oversize", valid(func(m map[string]any) { m["args"] = map[string]any{"path": "keep.txt", "content": huge} }), ErrInvalidArgs},
		{"bad operation id", valid(func(m map[string]any) { m["operation_id"] = "../../etc" }), ErrInvalidArgs},
		{"bad autonomy mode", valid(func(m map[string]any) { m["autonomy_mode"] = "yolo" }), ErrInvalidArgs},
		{"risk out of range", valid(func(m map[string]any) { m["risk_score"] = 7 }), ErrInvalidArgs},
		{"bad precondition", valid(func(m map[string]any) { m["precondition_refs"] = []any{map[string]any{"ref": "fs:keep.txt"}} }), ErrInvalidArgs},
		{"provenance not object", valid(func(m map[string]any) { m["provenance"] = []int{1} }), ErrInvalidArgs},
		{"policy hash missing", valid(func(m map[string]any) { delete(m, "policy_hash") }), ErrPolicyMismatch},
		{"policy hash stale", valid(func(m map[string]any) { m["policy_hash"] = "blake3:" + strings.Repeat("0", 64) }), ErrPolicyMismatch},
		{"no idempotency key", valid(func(m map[string]any) { delete(m, "idempotency_key") }), ErrIdempotencyKeyRequired},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := h.headSize()
			r := h.k.InvokeJSON(context.Background(), tc.raw)
			if errClass(r) != tc.class || r.Status != StatusError || r.TxOutcome != NoOp {
				t.Fatalf("got %q %s %s, want %q error no_op (%+v)", errClass(r), r.Status, r.TxOutcome, tc.class, r.Error)
			}
			if r.Receipt == nil || r.ResultHash == "" {
				t.Fatal("refusal without receipt or result hash")
			}
			if a := h.audits(before); len(a) != 1 || a[0].ErrorClass != tc.class {
				t.Fatalf("audit records %+v, want one with class %s", a, tc.class)
			}
			if got := h.read("keep.txt"); got != "keep" {
				t.Fatalf("workspace changed: %q", got)
			}
		})
	}
	entries, _ := os.ReadDir(h.ws)
	if len(entries) != 1 {
		t.Fatalf("workspace holds %d entries, want only keep.txt", len(entries))
	}
	mustVerify(t, h.k.Inspector())
}

// FuzzDecodeEnvelope: any input is refused or accepted, never a panic, and
// an accepted envelope has object args.
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"tool_id":"echo","args":{"text":"hi"},"agent_id":"a","capability_token":"t","capability_token_id":"j","policy_hash":"p"}`))
	f.Add([]byte(`{"tool_id":"fs.write","args":{"path":"a","content":"b"},"precondition_refs":[{"ref":"fs:a","absent":true}]}`))
	f.Add([]byte(`{"args":{"a":1,"a":2}}`))
	f.Add([]byte(`{"args":[]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := DecodeEnvelope(data)
		if err != nil {
			return
		}
		if len(env.Args) == 0 || env.Args[0] != '{' {
			t.Fatalf("accepted non-object args %q", env.Args)
		}
		if _, err := json.Marshal(env); err != nil {
			t.Fatalf("accepted envelope does not re-encode: %v", err)
		}
	})
}

func TestFIFOReadDoesNotHang(t *testing.T) {
	h := newHarness(t)
	if err := syscall.Mkfifo(filepath.Join(h.ws, "pipe"), 0o644); err != nil {
		t.Skip("mkfifo:", err)
	}
	r := h.invoke("fs.read", map[string]any{"path": "pipe"})
	if errClass(r) != ErrExecution || !strings.Contains(r.Error.Message, "not a regular file") {
		t.Fatalf("read of a FIFO: %+v", r.Error)
	}
}

func TestTooManyPreconditions(t *testing.T) {
	h := newHarness(t)
	r := h.invoke("fs.write", map[string]any{"path": "a", "content": "x"}, key("many"), func(e *Envelope) {
		for range MaxPreconditions + 1 {
			e.PreconditionRefs = append(e.PreconditionRefs, mustPre(`{"ref":"fs:a","absent":true}`))
		}
	})
	if errClass(r) != ErrInvalidArgs {
		t.Fatalf("class %q, want invalid_args", errClass(r))
	}
}

// An envelope handed to Invoke is held to MaxEnvelopeBytes by its encoded
// size, whether the size bound spares the encoding or not.
func TestInvokeEnvelopeLimit(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxEnvelopeBytes = 4096 })
	for _, tc := range []struct {
		name  string
		text  string
		class string
	}{
		{"small: bound under the limit", "hi", ""},
		{"bound over the limit, size under it", strings.Repeat("a", 1500), ""},
		{"over the limit", strings.Repeat("a", 5000), ErrInvalidArgs},
		{"escapes make it larger", strings.Repeat("<", 800), ErrInvalidArgs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.invoke("echo", map[string]any{"text": tc.text})
			if errClass(r) != tc.class {
				t.Fatalf("class %q (%+v), want %q", errClass(r), r.Error, tc.class)
			}
			if tc.class != "" && !strings.Contains(r.Error.Message, "the limit is 4096") {
				t.Fatalf("message %q", r.Error.Message)
			}
		})
	}
}

// TestOperationIDReused: a read naming an operation id already used is
// refused, whether the id is taken before the call starts or by a call
// that committed while it ran; a call naming none gets a fresh one.
func TestOperationIDReused(t *testing.T) {
	h := newHarness(t)
	h.write("a.txt", "a")
	id := newID()
	if r := h.invoke("fs.read", map[string]any{"path": "a.txt"}, opID(id)); r.Status != StatusOK {
		t.Fatalf("first call: %+v", r.Error)
	}
	r := h.invoke("fs.read", map[string]any{"path": "a.txt"}, opID(id))
	if r.Error == nil || r.Error.Class != ErrInvalidArgs || !strings.Contains(r.Error.Message, "already used") {
		t.Fatalf("second call with operation id %s: %+v, want invalid_args (already used)", id, r)
	}
	a, b := h.invoke("fs.read", map[string]any{"path": "a.txt"}), h.invoke("fs.read", map[string]any{"path": "a.txt"})
	if a.Status != StatusOK || b.Status != StatusOK || a.OperationID == b.OperationID {
		t.Fatalf("calls without an operation id: %s %q and %s %q", a.Status, a.OperationID, b.Status, b.OperationID)
	}
}

// An envelope built in Go (the local kernelctl call, an embedding
// program) may hold bytes that JSON could not carry: an idempotency key
// or agent id that is not UTF-8 is refused and audited, since records
// hold text where "k\xff" and "k\xfe" would read as one key while the
// idempotency table told them apart.
func TestInvalidUTF8Refused(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name string
		mod  func(*Envelope)
	}{
		{"idempotency key", key("k\xff")},
		{"another key of the same text", key("k\xfe")},
		{"agent id", func(e *Envelope) { e.AgentID = h.agent + "\xff" }},
	} {
		before := h.headSize()
		r := h.k.Invoke(context.Background(), h.env("fs.write", map[string]any{"path": "f.txt", "content": "x"}, tc.mod))
		if errClass(r) != ErrInvalidArgs || r.TxOutcome != NoOp || !strings.Contains(r.Error.Message, "UTF-8") {
			t.Errorf("%s: %s %s %+v, want invalid_args no_op naming UTF-8", tc.name, errClass(r), r.TxOutcome, r.Error)
		}
		if a := h.audits(before); len(a) != 1 {
			t.Errorf("%s: %d audit records, want 1", tc.name, len(a))
		}
	}
	if _, err := os.Stat(filepath.Join(h.ws, "f.txt")); !os.IsNotExist(err) {
		t.Errorf("f.txt written: %v", err)
	}
	mustVerify(t, h.k.Inspector())
}
