package telemetry

import (
	"log/slog"
	"sync"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// UpstreamLog is a kernel.Observer that logs the health of upstream MCP
// servers as calls find it: a warning when a server's calls start failing
// as upstream_unavailable, and an info line when one gets an answer again
// (ok or upstream_error) after that. Calls in between are not logged, so
// a server that is down costs one line, not one per call.
type UpstreamLog struct {
	Log *slog.Logger

	mu   sync.Mutex
	down map[string]bool // servers whose last call found them unavailable
}

// CallDone implements kernel.Observer.
func (l *UpstreamLog) CallDone(r *kernel.CallReport) {
	server, down, ok := upstreamHealth(r)
	if !ok {
		return
	}
	l.mu.Lock()
	if l.down == nil {
		l.down = map[string]bool{}
	}
	was := l.down[server]
	l.down[server] = down
	l.mu.Unlock()
	switch {
	case down && !was:
		l.Log.Warn("upstream MCP server unavailable", "mcp_server", server, "tool_id", r.ToolID, "error", r.ErrorMessage)
	case !down && was:
		l.Log.Info("upstream MCP server available again", "mcp_server", server)
	}
}

// GroupCommit implements kernel.Observer.
func (*UpstreamLog) GroupCommit(int, time.Duration) {}

// upstreamHealth says what call r tells of its upstream MCP server: down
// when it found the server unavailable, up when the server answered (ok,
// or an error of its own); ok is false for a call of no upstream tool or
// one refused before it reached the server, which says nothing of it.
func upstreamHealth(r *kernel.CallReport) (server string, down, ok bool) {
	server, ok = upstreamServer(r.ToolID)
	if !ok {
		return "", false, false
	}
	switch {
	case r.ErrorClass == kernel.ErrUpstreamUnavailable:
		return server, true, true
	case r.Status == kernel.StatusOK || r.ErrorClass == kernel.ErrUpstreamError:
		return server, false, true
	}
	return "", false, false
}
