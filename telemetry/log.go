package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

// NewLogger returns the server's logger writing to w: format "json" is
// one JSON object a line (log/slog's JSONHandler), "text" is slog's
// key=value text.
func NewLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q is not text or json", format)
}

// CallLog is a kernel.Observer that logs the calls an operator must hear
// about: internal errors (the store could not record a call: a durability
// failure) at error level, outcome_unknown at warning level.
type CallLog struct{ Log *slog.Logger }

// CallDone implements kernel.Observer.
func (l CallLog) CallDone(r *kernel.CallReport) {
	var level slog.Level
	switch r.ErrorClass {
	case kernel.ErrInternal:
		level = slog.LevelError
	case kernel.ErrOutcomeUnknown:
		level = slog.LevelWarn
	default:
		return
	}
	l.Log.LogAttrs(context.Background(), level, "call failed", slog.String("error_class", r.ErrorClass),
		slog.String("error", r.ErrorMessage), slog.String("operation_id", r.OperationID),
		slog.String("tool_id", r.ToolID), slog.String("agent_id", r.AgentID))
}

// GroupCommit implements kernel.Observer.
func (CallLog) GroupCommit(int, time.Duration) {}

// Observers is a kernel.Observer that tells each of its members, in order.
type Observers []kernel.Observer

// CallDone implements kernel.Observer.
func (os Observers) CallDone(r *kernel.CallReport) {
	for _, o := range os {
		o.CallDone(r)
	}
}

// GroupCommit implements kernel.Observer.
func (os Observers) GroupCommit(batch int, took time.Duration) {
	for _, o := range os {
		o.GroupCommit(batch, took)
	}
}
