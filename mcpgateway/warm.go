package mcpgateway

import (
	"context"
	"time"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
)

// warmIdle is how long a warm goroutine waits for its next call before it
// ends.
const warmIdle = 30 * time.Second

// warmInvoker runs each call of its invoker on a goroutine kept from one
// call to the next. The SDK serves every request on a goroutine of its
// own, which starts with a small stack; a kernel call runs deep (the
// policy evaluation above all), so that goroutine's stack was grown, that
// is copied, several times on every call: a seventh of the gateway's CPU
// per call in a profile of echo at c=8 (docs/mcp.md "Cost"). A kept
// goroutine's stack stays grown, as the HTTP API's connection goroutines'
// do. Calls never wait for one another: with no goroutine idle, a call
// starts a new one, which ends after warmIdle without work.
type warmInvoker struct {
	invoker runner.Invoker
	jobs    chan func() // unbuffered: a send succeeds only to an idle goroutine
}

func newWarmInvoker(i runner.Invoker) *warmInvoker {
	return &warmInvoker{invoker: i, jobs: make(chan func())}
}

// Invoke runs the call on a warm goroutine and returns its outcome; a
// panic of the invoker is raised again in the caller, as if it had been
// called directly.
func (w *warmInvoker) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	var (
		res      *kernel.Result
		err      error
		panicked any
	)
	done := make(chan struct{})
	job := func() {
		defer close(done)
		defer func() { panicked = recover() }()
		res, err = w.invoker.Invoke(ctx, env)
	}
	select {
	case w.jobs <- job:
	default:
		go w.work(job)
	}
	<-done
	if panicked != nil {
		panic(panicked)
	}
	return res, err
}

// work runs job, then the jobs it is given until it has been idle for
// warmIdle.
func (w *warmInvoker) work(job func()) {
	job()
	idle := time.NewTimer(warmIdle)
	defer idle.Stop()
	for {
		select {
		case job := <-w.jobs:
			job()
			idle.Reset(warmIdle)
		case <-idle.C:
			return
		}
	}
}
