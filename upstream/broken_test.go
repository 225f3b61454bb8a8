package upstream

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/upstream/upstreamtest"
)

// TestBrokenSession: a mutating call made while the session is broken
// but not yet known dead (the moment after a connection fails, before
// its reader notices) is never written, so it is sent on a new session —
// never outcome_unknown; a call during a reconnection waits for it within
// its own time; when no new session can be had it is
// upstream_unavailable, and nothing reached the upstream.
func TestBrokenSession(t *testing.T) {
	up := upstreamtest.New()
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return up.MCP }, nil))
	t.Cleanup(srv.Close)
	reg := syscalls.NewRegistry()
	set, err := Start(context.Background(), reg, map[string]Server{"web": {URL: srv.URL, Resources: []Declaration{{Tools: "*"}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { set.Close() })
	c := set.conns[0]
	// breakSession closes the live session and then hides that it died.
	breakSession := func() {
		c.mu.Lock()
		sess := c.sess
		c.mu.Unlock()
		sess.Close()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
			c.mu.Lock()
			dead := c.dead != nil
			if dead {
				c.dead = nil
			}
			c.mu.Unlock()
			if dead {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the closed session was never marked dead")
			}
		}
	}
	add, _ := reg.Get("mcp.web.add")
	args := &syscalls.Call{Args: json.RawMessage(`{"a":1,"b":2}`)}

	breakSession()
	out, err := add.New().Execute(context.Background(), args)
	if err != nil || up.Calls("add") != 1 {
		t.Fatalf("call on a broken session: %s, %v; the upstream got %d calls", out.Result, err, up.Calls("add"))
	}

	// Dead while a reconnection is under way: a call waits for it within
	// its own time — past that it ends unsent, else it goes out on the
	// new session.
	breakSession()
	c.mu.Lock()
	c.dead = errors.New("broken")
	c.mu.Unlock()
	c.dial <- struct{}{} // the reconnection under way
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if _, err := add.New().Execute(short, args); !errors.Is(err, context.DeadlineExceeded) || up.Calls("add") != 1 {
		t.Fatalf("call past its time while reconnecting: %v; the upstream got %d calls", err, up.Calls("add"))
	}
	done := make(chan error, 1)
	go func() {
		_, err := add.New().Execute(context.Background(), args)
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	<-c.dial // the reconnection under way gives up; the waiting call connects
	if err := <-done; err != nil || up.Calls("add") != 2 {
		t.Fatalf("call waiting for the reconnection: %v; the upstream got %d calls", err, up.Calls("add"))
	}

	// Broken, and the server gone: nothing can be sent.
	breakSession()
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = add.New().Execute(ctx, args)
	var f *syscalls.Failure
	if !errors.As(err, &f) || f.Class != syscalls.FailUpstreamUnavailable || up.Calls("add") != 2 {
		t.Fatalf("call with the server gone: %v; the upstream got %d calls", err, up.Calls("add"))
	}
}
