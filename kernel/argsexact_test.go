package kernel

import (
	"encoding/json"
	"strings"
	"testing"
)

// The syscall acts on the args the kernel hashes, audits and shows the
// policy: a number that is not the decimal of its canonical form (which would
// round) is refused, audited, before anything runs, and any other
// spelling reaches the syscall in its canonical form, so that what kv.put
// stores is what its record says and a repeat is compared on it.
func TestArgsActedOnAsAudited(t *testing.T) {
	h := newHarness(t)
	raw := func(s string) json.RawMessage { return json.RawMessage(s) }
	before := h.headSize()
	r := h.invoke("kv.put", raw(`{"key":"n","value":9007199254740993}`), key("big"))
	if errClass(r) != ErrInvalidArgs || r.TxOutcome != NoOp || !strings.Contains(r.Error.Message, "is not the decimal its canonical form") {
		t.Fatalf("kv.put of 9007199254740993: %s %s %+v, want invalid_args no_op", errClass(r), r.TxOutcome, r.Error)
	}
	if a := h.audits(before); len(a) != 1 {
		t.Fatalf("%d audit records of the refusal, want 1", len(a))
	}
	if r := h.invoke("kv.get", map[string]any{"key": "n"}); r.Status == StatusOK && strings.Contains(string(r.Result), "9007199254740992") {
		t.Fatalf("the refused value was stored: %s", r.Result)
	}

	first := h.invoke("kv.put", raw(`{"value":{"b":1.50,"a":[1.0,2e0]},"key":"n"}`), key("spelled"))
	mustOK(t, first)
	got := h.invoke("kv.get", map[string]any{"key": "n"})
	mustOK(t, got)
	if !strings.Contains(string(got.Result), `{"a":[1,2],"b":1.5}`) {
		t.Errorf("kv.get = %s, want the value stored as audited, {\"a\":[1,2],\"b\":1.5}", got.Result)
	}
	again := h.invoke("kv.put", raw(`{"key":"n","value":{"a":[1,2],"b":1.5}}`), key("spelled"))
	if !again.Replayed || again.OperationID != first.OperationID {
		t.Errorf("the same value spelled canonically under the same key: %+v, want a replay of %s", again, first.OperationID)
	}
	other := h.invoke("kv.put", raw(`{"key":"n","value":{"a":[1,2],"b":1.25}}`), key("spelled"))
	if errClass(other) != ErrIdempotencyConflict {
		t.Errorf("another value under the same key: %s %+v, want idempotency_conflict", errClass(other), other.Error)
	}
	mustVerify(t, h.k.Inspector())
}
