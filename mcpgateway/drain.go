package mcpgateway

import (
	"context"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// drainConn answers every request it read before it reports the end of
// the client's input. The SDK ends a session when a read fails, dropping
// the answers of calls still running: a client that writes its requests to
// a pipe and closes it (a script, a test harness) got no answer at all,
// not even to initialize. Each call is audited either way; this only lets
// its answer reach the client. A request never answered (one waiting for
// an approval) holds the end until it is answered or ctx is done, so the
// gateway's life after the end of input is bounded by the kernel's call and
// approval timeouts. Once a write to the client has failed (it is gone: no
// answer can reach it, and the SDK writes nothing more) the end is held no
// longer, and the SDK's end of the session cancels the calls still running.
type drainConn struct {
	mcp.Connection

	mu      sync.Mutex
	pending map[jsonrpc.ID]bool // requests read and not answered (1 and "1" are two ids)
	idle    *sync.Cond          // signalled when pending shrinks or a write fails
	broken  bool                // a write failed
	closed  bool                // the SDK closed the connection: it writes nothing more

	ended   func()    // unless nil, runs when the input ends, before the wait
	batches *batchIDs // unless nil, the open batches' ids, each forgotten as it is answered
}

func newDrainConn(c mcp.Connection) *drainConn {
	d := &drainConn{Connection: c, pending: map[jsonrpc.ID]bool{}}
	d.idle = sync.NewCond(&d.mu)
	return d
}

// Read reads the next message; at the end of input it first waits for the
// requests in flight to be answered.
func (d *drainConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	m, err := d.Connection.Read(ctx)
	if err != nil {
		if d.ended != nil {
			d.ended()
		}
		d.wait(ctx)
		return m, err
	}
	if r, ok := m.(*jsonrpc.Request); ok && r.ID.IsValid() {
		d.mu.Lock()
		d.pending[r.ID] = true
		d.mu.Unlock()
	}
	return m, nil
}

// Write writes a message; a response settles its request, and a write
// that failed other than by its ctx's end every request.
func (d *drainConn) Write(ctx context.Context, m jsonrpc.Message) error {
	err := d.Connection.Write(ctx, m)
	// A write refused because its own context was done (a progress
	// notification racing the client's cancel) wrote nothing and says
	// nothing of the client: the SDK does not count it as a failed
	// connection either.
	failed := err != nil && ctx.Err() == nil
	r, ok := m.(*jsonrpc.Response)
	if failed || err == nil && ok && r.ID.IsValid() {
		d.mu.Lock()
		if failed {
			d.broken = true
		} else {
			delete(d.pending, r.ID)
			if d.batches != nil {
				d.batches.answered(r.ID)
			}
		}
		d.idle.Broadcast()
		d.mu.Unlock()
	}
	return err
}

// Close closes the connection. The SDK closes it when serving ends (its
// ctx is done) and writes no answer after that, so the end of input is
// held no longer: the SDK's close waits for its reader, which would wait
// for those answers.
func (d *drainConn) Close() error {
	d.mu.Lock()
	d.closed = true
	d.idle.Broadcast()
	d.mu.Unlock()
	return d.Connection.Close()
}

// wait returns once no request is pending, a write failed, the
// connection was closed or ctx is done.
func (d *drainConn) wait(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		d.mu.Lock()
		d.idle.Broadcast()
		d.mu.Unlock()
	})
	defer stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.pending) > 0 && !d.broken && !d.closed && ctx.Err() == nil {
		d.idle.Wait()
	}
}
