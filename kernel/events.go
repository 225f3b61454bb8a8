package kernel

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/capkernel/capkernel/ledger"
)

// Event kinds. A call emits, in order: tool.confirmation_requested and
// tool.confirmation_resolved when it waits for an approval; tool.called
// when its syscall starts to execute; then exactly one of tool.completed
// (status ok, replays included), tool.failed (an error once tool.called
// was emitted, with its error class), tool.input_invalid (invalid_args
// before execution) or tool.denied (any other refusal before execution,
// approval denials and timeouts included).
const (
	EventCalled                = "tool.called"
	EventCompleted             = "tool.completed"
	EventFailed                = "tool.failed"
	EventInputInvalid          = "tool.input_invalid"
	EventDenied                = "tool.denied"
	EventConfirmationRequested = "tool.confirmation_requested"
	EventConfirmationResolved  = "tool.confirmation_resolved"
)

// EventKinds lists every event kind, in the order a call may emit them.
var EventKinds = []string{EventConfirmationRequested, EventConfirmationResolved, EventCalled, EventCompleted, EventFailed, EventInputInvalid, EventDenied}

// Event is one thing that happened to a call. The JSON field names are the
// wire format of GET /v1/events.
type Event struct {
	Seq         uint64 `json:"seq"` // increasing within one kernel run
	Kind        string `json:"kind"`
	Time        string `json:"time"`
	OperationID string `json:"operation_id"`
	ToolID      string `json:"tool_id"`
	AgentID     string `json:"agent_id"`
	SessionID   string `json:"session_id,omitempty"`
	SideEffect  string `json:"side_effect,omitempty"`
	ErrorClass  string `json:"error_class,omitempty"`
	Message     string `json:"message,omitempty"`
	TxOutcome   string `json:"tx_outcome,omitempty"`
	Replayed    bool   `json:"replayed,omitempty"`
	// SessionRunning, on tool.called, is how many calls of the session
	// were executing, this one included.
	SessionRunning int              `json:"session_running,omitempty"`
	Approval       *ApprovalRequest `json:"approval,omitempty"` // confirmation events
	// own says that Message is the calling agent's alone: the call is
	// audited at depth commitments_only, and the message, part of its
	// result, may quote its args (Access.Event).
	own bool
}

// EventFilter selects events; zero fields match everything.
type EventFilter struct {
	SessionID string
	AgentID   string
	Kinds     []string
}

func (f EventFilter) match(e *Event) bool {
	return (f.SessionID == "" || f.SessionID == e.SessionID) &&
		(f.AgentID == "" || f.AgentID == e.AgentID) &&
		(len(f.Kinds) == 0 || slices.Contains(f.Kinds, e.Kind))
}

// Subscription receives the events its filter selects. A subscriber that
// does not keep up loses events instead of slowing calls down: each lost
// event is counted in Dropped.
type Subscription struct {
	C       <-chan Event
	c       chan Event
	filter  EventFilter
	dropped atomic.Uint64
	bus     *eventBus
}

// Dropped returns how many events were lost because C was full.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close ends the subscription; C is closed.
func (s *Subscription) Close() { s.bus.unsubscribe(s) }

// eventBus fans events out to subscribers without ever blocking the
// publisher.
type eventBus struct {
	seq    atomic.Uint64
	mu     sync.RWMutex
	subs   map[*Subscription]struct{}
	closed bool
}

func newEventBus() *eventBus { return &eventBus{subs: map[*Subscription]struct{}{}} }

// DefaultEventBuffer is the events a subscriber may fall behind by before
// it loses some.
const DefaultEventBuffer = 1024

// Subscribe returns a subscription to the events f selects, buffering up
// to buffer of them (DefaultEventBuffer if not positive).
func (k *Kernel) Subscribe(f EventFilter, buffer int) *Subscription {
	if buffer <= 0 {
		buffer = DefaultEventBuffer
	}
	c := make(chan Event, buffer)
	s := &Subscription{C: c, c: c, filter: f, bus: k.events}
	k.events.mu.Lock()
	defer k.events.mu.Unlock()
	if k.events.closed {
		close(c)
		return s
	}
	k.events.subs[s] = struct{}{}
	return s
}

func (b *eventBus) unsubscribe(s *Subscription) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; ok {
		delete(b.subs, s)
		close(s.c)
	}
}

// close ends every subscription and refuses new ones.
func (b *eventBus) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		delete(b.subs, s)
		close(s.c)
	}
}

func (b *eventBus) publish(e Event) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if len(b.subs) == 0 {
		return
	}
	e.Seq = b.seq.Add(1)
	e.Time = ledger.FormatTime(time.Now())
	for s := range b.subs {
		if !s.filter.match(&e) {
			continue
		}
		select {
		case s.c <- e:
		default:
			s.dropped.Add(1)
		}
	}
}

// event returns the event of kind about call c.
func (c *call) event(kind string) Event {
	e := Event{Kind: kind, OperationID: c.env.OperationID, ToolID: c.env.ToolID, AgentID: c.agent(), SessionID: c.session}
	e.SideEffect = string(c.effect)
	return e
}

// publishResult emits the event that ends call c, whose result is r.
func (k *Kernel) publishResult(c *call, r *Result) *Result {
	var e Event
	switch {
	case r.Status == StatusOK:
		e = c.event(EventCompleted)
	case c.called:
		e = c.event(EventFailed)
	case r.Error != nil && r.Error.Class == ErrInvalidArgs:
		e = c.event(EventInputInvalid)
	default:
		e = c.event(EventDenied)
	}
	if r.Error != nil {
		e.ErrorClass, e.Message = r.Error.Class, r.Error.Message
		e.own = k.recordDepth(c) == DepthCommitmentsOnly
	}
	e.TxOutcome, e.Replayed = r.TxOutcome, r.Replayed
	k.events.publish(e)
	k.observed(c, r, e.own)
	return r
}
