package mcpgateway

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeConn is a connection whose input holds one request, then ends
// (once eof is closed), and whose Write fails with ctx's error on a done
// ctx, as the SDK's ioConn does, or with err.
type fakeConn struct {
	mcp.Connection
	read bool
	eof  chan struct{}
	err  error
}

func (c *fakeConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	if !c.read {
		c.read = true
		id, _ := jsonrpc.MakeID(float64(2))
		return &jsonrpc.Request{ID: id, Method: "tools/call"}, nil
	}
	<-c.eof
	return nil, io.EOF
}

func (c *fakeConn) Write(ctx context.Context, m jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return c.err
}

// A write refused only because its context was done (a progress
// notification racing the client's notifications/cancelled) does not mark
// the client gone: the end of input still waits for the answers of the
// requests in flight. It was taken as the client gone, and the end of
// input cancelled the calls still waiting for an approver, their answers
// never sent (rev12 #3). A write that fails on a live context still ends
// the wait.
func TestDrainCancelledWriteKeepsClient(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error // what the write fails with on a live context
		holds  bool  // the end of input waits for the answer
		cancel bool  // the write's context is done
	}{
		{"cancelled write", nil, true, true},
		{"failed write", errors.New("broken pipe"), false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fc := &fakeConn{eof: make(chan struct{}), err: c.err}
			d := newDrainConn(fc)
			if _, err := d.Read(context.Background()); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if c.cancel {
				cancel()
			}
			d.Write(ctx, &jsonrpc.Request{Method: "notifications/progress"})
			cancel()
			var answered atomic.Bool
			ended := make(chan bool, 1)
			close(fc.eof)
			go func() {
				d.Read(context.Background())
				ended <- answered.Load()
			}()
			if c.holds {
				time.Sleep(50 * time.Millisecond) // let a wrong end come first
				answered.Store(true)
				id, _ := jsonrpc.MakeID(float64(2))
				d.Write(context.Background(), &jsonrpc.Response{ID: id})
			}
			if got := <-ended; got != c.holds {
				t.Errorf("the end of input came after the answer: %v, want %v", got, c.holds)
			}
		})
	}
}
