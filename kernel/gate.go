package kernel

import (
	"errors"
	"sync"
)

// ErrKernelClosing is the cause with which Close cancels the calls in
// flight, and why a call that comes after Close began does not run.
var ErrKernelClosing = errors.New("the kernel is closing")

// gate counts the calls running so that Close can end them and wait for
// their records before it closes the store: a call cut by a closed store
// (an upstream call that ran, its record refused) would be an unaudited
// call. Once closing, it admits no call.
type gate struct {
	mu      sync.Mutex
	n       int
	closing bool
	idle    *sync.Cond // signalled when n falls to 0
}

// enter admits a call, which must leave when it has its answer (and,
// for a background call, its record); false once closing.
func (g *gate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.n++
	return true
}

// leave ends a call enter admitted.
func (g *gate) leave() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n--; g.n == 0 && g.idle != nil {
		g.idle.Broadcast()
	}
}

// close admits no more calls, runs cancel (which ends the calls in
// flight) and waits until every admitted call has left.
func (g *gate) close(cancel func()) {
	g.mu.Lock()
	g.closing = true
	g.mu.Unlock()
	cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.idle == nil {
		g.idle = sync.NewCond(&g.mu)
	}
	for g.n > 0 {
		g.idle.Wait()
	}
}

// closingAnswer is the answer to a call that came after Close began: it
// did not run, and no record backs it (the store is closing).
func (k *Kernel) closingAnswer(c *call) *Result {
	r := k.unrecorded(c, "the kernel is closing: the call did not run and is not recorded; repeat it once the kernel runs again", NoOp)
	r.closing = true
	return r
}

// cancelAll cancels every call in flight with cause, and every call
// registered from now on as it registers (add): a call the gate admitted
// before it closed may register only after this.
func (r *registry) cancelAll(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closing = cause
	for _, f := range r.calls {
		f.cancel(cause)
	}
}
