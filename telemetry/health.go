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
	server, ok := upstreamServer(r.ToolID)
	if !ok {
		return
	}
	var down bool
	switch {
	case r.ErrorClass == kernel.ErrUpstreamUnavailable:
		down = true
	case r.Status == kernel.StatusOK || r.ErrorClass == kernel.ErrUpstreamError:
	default:
		return // refused before it reached the server: says nothing of it
	}
	l.mu.Lock()
	if l.down == nil {
		l.down = map[string]bool{}
	}
	was, known := l.down[server]
	l.down[server] = down
	l.mu.Unlock()
	switch {
	case down && !was:
		l.Log.Warn("upstream MCP server unavailable", "mcp_server", server, "tool_id", r.ToolID, "error", r.ErrorMessage)
	case !down && was && known:
		l.Log.Info("upstream MCP server available again", "mcp_server", server)
	}
}

// GroupCommit implements kernel.Observer.
func (*UpstreamLog) GroupCommit(int, time.Duration) {}
