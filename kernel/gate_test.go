package kernel

import (
	"context"
	"strings"
	"sync"
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

// TestCloseCancelsCallsAdmittedLate: a call the gate admitted just before
// Close, but that registered as in flight only after Close cancelled the
// calls in flight, is cancelled as it registers: Close does not wait for
// its approval (60 s here).
func TestCloseCancelsCallsAdmittedLate(t *testing.T) {
	for iter := range 20 {
		h := newHarness(t, func(c *Config) { c.ApprovalTimeout = time.Minute })
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 16 {
			env := h.env("fs.write", map[string]any{"path": "Makefile", "content": "x"}, key("k"+newID()))
			wg.Go(func() {
				<-start
				h.k.Invoke(context.Background(), env)
			})
		}
		close(start)
		time.Sleep(time.Duration(iter%8) * 100 * time.Microsecond)
		closed := make(chan struct{})
		go func() { h.k.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(30 * time.Second):
			t.Fatalf("iteration %d: Close waits for a call admitted before it, which waits for its approval", iter)
		}
		wg.Wait()
	}
}

// closingObserver closes its kernel from the first call it is told of.
type closingObserver struct {
	k    **Kernel
	once sync.Once
	done chan struct{}
}

func (o *closingObserver) CallDone(*CallReport) {
	o.once.Do(func() {
		(*o.k).Close()
		close(o.done)
	})
}

func (o *closingObserver) GroupCommit(int, time.Duration) {}

// TestCloseFromObserver: an Observer may close the kernel from CallDone:
// the call it is told of has left the gate Close waits on.
func TestCloseFromObserver(t *testing.T) {
	var k *Kernel
	o := &closingObserver{k: &k, done: make(chan struct{})}
	h := newHarness(t, func(c *Config) { c.Observer = o })
	k = h.k
	go h.k.Invoke(context.Background(), h.env("echo", map[string]any{"text": "x"}))
	select {
	case <-o.done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close called from Observer.CallDone has not returned: the call holds the gate")
	}
}
