package kernel

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// errNotPrepared is what a gated syscall's Gate returns when the call was
// refused at prepare (or answered by a replay): it must do nothing more.
var errNotPrepared = errors.New("the call was not prepared: nothing of it runs")

// gatedExec is the execution of a Gated syscall (syscalls.Definition.Gated),
// started while the call's prepare transaction commits: the syscall sets
// up (proc.exec: bwrap builds the sandbox) during the fsync and waits in
// Call.Gate before any effect, so a command never runs before its intent
// is durable, and the call waits for one durable commit, not two, before
// its command starts.
type gatedExec struct {
	decided chan struct{} // closed once the prepare has decided
	err     error         // nil: the gate is open; set before decided closes
	done    chan struct{} // closed when execute has returned
	out     json.RawMessage
	class   string
	msg     string
}

// startGated starts executing c, gated, on stage.
func (k *Kernel) startGated(ctx context.Context, c *call, resources []*syscalls.Resource, stage *txn.Stage) *gatedExec {
	g := &gatedExec{decided: make(chan struct{}), done: make(chan struct{})}
	c.gate = g.wait
	go func() {
		defer close(g.done)
		g.out, g.class, g.msg = k.execute(ctx, c, resources, stage)
	}()
	return g
}

// wait is the syscall's Call.Gate.
func (g *gatedExec) wait() error {
	<-g.decided
	return g.err
}

// open lets the syscall act, now that its intent is durable, and returns
// its outcome once it has ended.
func (g *gatedExec) open(k *Kernel, c *call) (out json.RawMessage, class, msg string) {
	k.calledEvent(c)
	close(g.decided)
	<-g.done
	return g.out, g.class, g.msg
}

// refuse ends a gated execution whose call was not prepared: the syscall
// returns having done nothing, and whatever it staged is discarded.
func (g *gatedExec) refuse(stage *txn.Stage) {
	if g == nil {
		return
	}
	g.err = errNotPrepared
	close(g.decided)
	<-g.done
	stage.Discard()
}

// calledEvent marks c as executing and emits tool.called.
func (k *Kernel) calledEvent(c *call) {
	c.called = true
	e := c.event(EventCalled)
	e.SessionRunning = c.running
	k.events.publish(e)
}
