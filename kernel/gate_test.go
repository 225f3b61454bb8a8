package kernel

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestCloseEndsCallsInFlight: Close cancels a call in flight (here one
// waiting for an approval) and waits for its record before it closes the
// store: the call ends cancelled, with a receipt the reopened ledger
// holds. A call made once Close began does not run.
func TestCloseEndsCallsInFlight(t *testing.T) {
	h := newHarness(t)
	_, res := h.gated("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("c1"))
	closed := make(chan error, 1)
	go func() { closed <- h.k.Close() }()
	var r *Result
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("Close left the call waiting for its approval")
	}
	if errClass(r) != ErrCancelled || r.ReceiptID == "" {
		t.Fatalf("the call in flight at Close: %+v", r)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	late := h.k.Invoke(context.Background(), h.env("echo", map[string]any{"text": "late"}))
	if errClass(late) != ErrInternal || late.ReceiptID != "" || !strings.Contains(late.Error.Message, "did not run") {
		t.Fatalf("a call after Close: %+v", late)
	}
	h.open()
	if _, err := h.k.Inspector().Receipt(r.ReceiptID); err != nil {
		t.Fatalf("the reopened ledger lacks the cancelled call's record: %v", err)
	}
}
