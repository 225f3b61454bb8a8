package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/txn"
)

// Asynchronous calls: Start runs an envelope in the background and
// returns its operation id at once; Operation reports it, running (and
// whether it waits for an approval) or finished. A background call is not
// tied to the request that started it: only Cancel, CancelSession or its
// own timeouts end it early. Finished results stay readable here for
// asyncRetention (the stored outcome of the operations table outlives
// that for calls that changed something).

// Errors of Start.
var (
	// ErrOperationInUse: a call in flight, or one finished, already has
	// the operation id.
	ErrOperationInUse = errors.New("operation_id is in use by another call")
	// ErrTooManyBackground: MaxBackground background calls are running,
	// or MaxBackgroundPerAgent of one agent's.
	ErrTooManyBackground = errors.New("too many background calls running")
	// ErrBadOperationID: the envelope names an operation_id that is no
	// UUID in canonical form.
	ErrBadOperationID = errors.New("bad operation_id")
)

const (
	asyncRetention = time.Hour
	asyncKeep      = 10000
	// asyncKeepBytes bounds the bytes of the finished results kept in
	// memory, and asyncKeepBytesPerAgent those of one agent family
	// (agentFamily), so that no agent fills the kernel's memory with
	// results, nor pushes out other agents' (resultBytes counts them):
	// past a bound the oldest go first, and the operations table answers
	// for them, as for any after asyncRetention.
	asyncKeepBytes         = 256 << 20
	asyncKeepBytesPerAgent = asyncKeepBytes / 4
	// MaxBackground bounds the background calls running at once, so that
	// async requests cannot pile up goroutines and waits without end.
	MaxBackground = 1024
	// MaxBackgroundPerAgent bounds those of one agent with its sub-agents
	// (agent/…, which speak for it; calls whose token did not verify count
	// together), so that no agent takes every slot (a call waiting for an
	// approval holds one until it is decided or times out).
	MaxBackgroundPerAgent = MaxBackground / 4
)

// Operation states.
const (
	OpRunning          = "running"
	OpAwaitingApproval = "awaiting_approval"
	OpDone             = "done"
)

type operation struct {
	agent    string
	family   string // agentFamily(agent)
	done     chan struct{}
	result   *Result
	size     int // resultBytes(result), once finished
	finished time.Time
	// erased says that the call's record was erased while it ran (its
	// record commits before its result is kept here): the result is
	// kept erased.
	erased bool
}

type operations struct {
	mu      sync.Mutex
	byID    map[string]*operation
	order   []string // finished ids, oldest first, for pruning
	running int
	byAgent map[string]int // running calls per agent family (agentFamily)

	kept        int            // bytes of the finished results in byID
	keptByAgent map[string]int // the same per agent family
	// maxKept and maxKeptPerAgent are asyncKeepBytes and
	// asyncKeepBytesPerAgent (tests make them smaller).
	maxKept, maxKeptPerAgent int
}

func newOperations() operations {
	return operations{byID: map[string]*operation{}, byAgent: map[string]int{}, keptByAgent: map[string]int{},
		maxKept: asyncKeepBytes, maxKeptPerAgent: asyncKeepBytesPerAgent}
}

// agentFamily is the agent whose background slots a call of agent uses:
// the first component of its name (a sub-agent's parent's, whose token it
// was attenuated from).
func agentFamily(agent string) string {
	family, _, _ := strings.Cut(agent, "/")
	return family
}

// Start runs the call envelope data in the background, as InvokeJSON
// would, and returns the call's operation id (the envelope's, or a new
// one when it names none or its token does not verify). A call it cannot
// start is refused at once, audited like any other: refused is its
// result, and err wraps
// ErrOperationInUse (the refusal gets an operation id of its own, since
// the one asked for belongs to another call, in flight or finished),
// ErrBadOperationID (the same: no call has such an id) or
// ErrTooManyBackground.
func (k *Kernel) Start(ctx context.Context, data []byte) (id string, refused *Result, err error) {
	c, class, msg := k.decode(data)
	c.caller = ctx // the call runs on its own context; the caller's values still identify it
	if !k.calls.enter() {
		return "", k.publishResult(c, k.closingAnswer(c)), ErrKernelClosing
	}
	// The call leaves the gate once recorded, before its event and
	// Observer report (an Observer may call Close): here if it is
	// refused, in its goroutine if it runs.
	leave := sync.OnceFunc(k.calls.leave)
	launched := false
	defer func() {
		if !launched {
			leave()
		}
	}()
	report := func(r *Result) *Result {
		leave()
		return k.publishResult(c, r)
	}
	// The call is its agent's only if its token verifies: anyone can
	// send an envelope naming any agent and any id. A named id is
	// reserved only for such a call; another runs under a new one (and
	// is refused there), belonging to no agent.
	agent := ""
	if class == "" {
		if tok, cl, _ := k.verifyToken(c.env); cl == "" {
			// A refusal Start records itself is the agent's own call.
			c.token, agent = tok, c.env.AgentID
		}
	}
	// An id no call could have is refused now, before anything holds
	// it (in memory, or in a record), under an id of its own.
	badID := class == "" && c.env.OperationID != "" && !canonicalUUID(c.env.OperationID)
	if agent == "" || badID {
		c.disown()
	}
	if c.env.OperationID == "" {
		c.env.OperationID, c.minted = newID(), true
	}
	if badID {
		err := fmt.Errorf("%w: operation_id is not a UUID in canonical form", ErrBadOperationID)
		return "", report(k.deny(ctx, c, ErrInvalidArgs, err.Error())), err
	}
	id = c.env.OperationID
	op := &operation{agent: agent, family: agentFamily(agent), done: make(chan struct{})}
	// An id a finished call has (stored, or still in memory) is refused
	// here too, not only by the pipeline: registered, the refused call
	// would stand in memory for the call that owns the id.
	used := false
	if !c.minted {
		if err := k.db.View(func(tx *bbolt.Tx) error { used = txn.OperationUsed(tx, id); return nil }); err != nil {
			return "", report(k.deny(ctx, c, ErrInternal, err.Error())), err
		}
	}
	c.background = true
	// The call runs on a context of its own, cancelled through the
	// registry of calls in flight, where its id is reserved from here on
	// (a synchronous call naming it is refused: run).
	bctx, cancel := context.WithCancelCause(context.Background())
	k.ops.mu.Lock()
	_, inUse := k.ops.byID[id]
	var done func()
	family := agentFamily(agent)
	if !inUse && !used && k.ops.running < MaxBackground && k.ops.byAgent[family] < MaxBackgroundPerAgent {
		var ok bool
		session, _ := sessionOf(c.env.Provenance) // the pipeline refuses a stale state
		done, ok = k.inflight.add(id, &inflight{agent: agent, session: session, cancel: cancel})
		inUse = !ok
	}
	if done != nil && !c.minted {
		// Again, the id reserved: a synchronous call that recorded it
		// left the registry only after its record committed, maybe just
		// after the check above (run checks in this order too).
		err := k.db.View(func(tx *bbolt.Tx) error { used = txn.OperationUsed(tx, id); return nil })
		if err != nil || used {
			done()
		}
		if err != nil {
			k.ops.mu.Unlock()
			cancel(nil)
			return "", report(k.deny(ctx, c, ErrInternal, err.Error())), err
		}
	}
	if inUse || used {
		k.ops.mu.Unlock()
		cancel(nil)
		err = fmt.Errorf("%w: %s", ErrOperationInUse, id)
		c.disown()
		return "", report(k.deny(ctx, c, ErrInvalidArgs, err.Error())), err
	}
	if done == nil {
		k.ops.mu.Unlock()
		cancel(nil)
		// Refused for now, not for its id: a retry later may name it.
		c.disown()
		err = fmt.Errorf("%w (%d, at most %d of one agent with its sub-agents); retry later or call synchronously", ErrTooManyBackground, MaxBackground, MaxBackgroundPerAgent)
		return "", report(k.deny(ctx, c, ErrConcurrencyExceeded, err.Error())), err
	}
	k.ops.byID[id] = op
	k.ops.running++
	k.ops.byAgent[family]++
	k.ops.mu.Unlock()
	// A named id is the call's from here on, its token verified above:
	// a refusal later in the pipeline (the token expired since, say) is
	// recorded, and served, under it.
	c.reserved = !c.minted
	k.background.Add(1)
	launched = true
	go func() {
		defer k.background.Done()
		defer done()
		defer cancel(nil)
		ctx := bctx
		var r *Result
		if class != "" {
			r = k.deny(ctx, c, class, msg)
		} else {
			r = k.run(ctx, c)
		}
		r = report(r)
		k.ops.finish(id, op, r, family)
		close(op.done)
	}()
	return id, nil, nil
}

// forgetResult drops from memory what an erasure removes (Result.erase:
// the result, audit salt, provenance, risk basis and error message) of
// operation id, as forgetResult (erase.go) does in the stored copies, so
// that no read of the operation serves a payload after its erasure. An
// operation still running is marked, and its result is kept erased when
// it comes.
func (o *operations) forgetResult(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	op := o.byID[id]
	if op == nil {
		return
	}
	op.erased = true
	if op.result != nil {
		o.keep(op, erased(op.result))
	}
}

// finish keeps r as the result of the background call id (op, of agent
// family family), erased if the call's record was erased while it ran
// (forgetResult).
func (o *operations) finish(id string, op *operation, r *Result, family string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.running--
	if o.byAgent[family]--; o.byAgent[family] == 0 {
		delete(o.byAgent, family)
	}
	if op.erased {
		r = erased(r)
	}
	op.finished = time.Now()
	o.keep(op, kept(r))
	o.order = append(o.order, id)
	o.prune(op.family)
}

// keep makes r the result of op, counting its bytes (under mu).
func (o *operations) keep(op *operation, r *Result) {
	o.kept -= op.size
	o.keptByAgent[op.family] -= op.size
	op.result, op.size = r, resultBytes(r)
	o.kept += op.size
	o.keptByAgent[op.family] += op.size
}

// kept returns a copy of r that holds no memory of the call's: r points
// into the call (its envelope, args and payload), and a result kept an
// hour must not keep those.
func kept(r *Result) *Result {
	cp := *r
	cp.Result, cp.Provenance = bytes.Clone(r.Result), bytes.Clone(r.Provenance)
	cp.Notes = maps.Clone(r.Notes)
	for k, v := range cp.Notes {
		cp.Notes[k] = bytes.Clone(v)
	}
	return &cp
}

// resultBytes is about the memory a kept result holds: its variable
// parts and a share for the rest.
func resultBytes(r *Result) int {
	n := 1<<10 + len(r.OperationID) + len(r.Result) + len(r.Provenance)
	for k, v := range r.Notes {
		n += len(k) + len(v)
	}
	if r.Error != nil {
		n += len(r.Error.Message)
	}
	if r.Receipt != nil {
		n += len(r.Receipt.Entry) + len(r.Receipt.Checkpoint)
	}
	return n
}

// erased returns a copy of r with what an erasure removes removed.
func erased(r *Result) *Result {
	cp := *r
	cp.erase()
	return &cp
}

// prune forgets finished operations past their retention, past asyncKeep
// of them, and, oldest first, those over the byte bounds: those of agent
// family family over its own, then any over the total (under mu).
func (o *operations) prune(family string) {
	drop := func(id string, op *operation) {
		delete(o.byID, id)
		o.kept -= op.size
		if o.keptByAgent[op.family] -= op.size; o.keptByAgent[op.family] <= 0 {
			delete(o.keptByAgent, op.family)
		}
	}
	left := o.order[:0]
	for i, id := range o.order {
		op := o.byID[id]
		if op == nil || op.result == nil {
			continue
		}
		over := o.keptByAgent[family] > o.maxKeptPerAgent || o.kept > o.maxKept
		if len(o.order)-i > asyncKeep || time.Since(op.finished) >= asyncRetention ||
			over && (op.family == family || o.kept > o.maxKept) {
			drop(id, op)
			continue
		}
		if !over {
			// The rest finished later, within the count: all are kept.
			left = append(left, o.order[i:]...)
			break
		}
		left = append(left, id)
	}
	clear(o.order[len(left):])
	o.order = left
}

// OperationStatus is what Operation knows of a background call.
type OperationStatus struct {
	OperationID string           `json:"operation_id"`
	State       string           `json:"state"` // running, awaiting_approval or done
	AgentID     string           `json:"agent_id"`
	Approval    *ApprovalRequest `json:"approval,omitempty"` // the pending approval, when awaiting one
	Result      *Result          `json:"result,omitempty"`   // when done
}

// OperationFor is Operation as reader acc may see it: nothing (false)
// unless acc reads the calling agent's records in full; and to a reader
// other than that agent (the admin, an auditor) the result of a call
// audited at depth commitments_only as it is stored, none of the call's
// parts in it (Result.withhold), since those are kept in memory for the
// caller alone.
func (k *Kernel) OperationFor(id string, acc Access) (OperationStatus, bool) {
	st, ok := k.Operation(id)
	if !ok || !acc.Full(st.AgentID) {
		return OperationStatus{}, false
	}
	if st.Result != nil && acc.Agent != st.AgentID && k.resultDepth(st.Result.ToolID) == DepthCommitmentsOnly {
		r := *st.Result
		r.withhold(NotKeptMessage)
		st.Result = &r
	}
	return st, true
}

// resultDepth is the audit depth a finished call of tool was recorded
// at, as far as its result tells: its tool's, or, for a call by a handle
// refused before the handle resolved (its tool is the handle), the
// strictest depth configured, which recordDepth may have taken; the
// strictest too for a call whose envelope did not decode as far as its
// tool id (tool ""), whose error may quote any tool's args.
func (k *Kernel) resultDepth(tool string) string {
	if tool == "" || strings.HasPrefix(tool, HandlePrefix) {
		return k.audit.strictest()
	}
	return k.depthOf(tool)
}

// Operation reports the background call id, if Start began it within the
// retention period.
func (k *Kernel) Operation(id string) (OperationStatus, bool) {
	k.ops.mu.Lock()
	op, ok := k.ops.byID[id]
	var res *Result
	if ok {
		res = op.result
	}
	k.ops.mu.Unlock()
	if !ok {
		return OperationStatus{}, false
	}
	st := OperationStatus{OperationID: id, State: OpDone, AgentID: op.agent, Result: res}
	if res == nil {
		st.State = OpRunning
		k.approvals.mu.Lock()
		for _, a := range k.approvals.pending {
			if a.req.OperationID == id {
				req := a.req
				st.State, st.Approval = OpAwaitingApproval, &req
			}
		}
		k.approvals.mu.Unlock()
	}
	return st, true
}

// Wait waits until the background call id is done or ctx ends.
func (k *Kernel) Wait(ctx context.Context, id string) (*Result, error) {
	k.ops.mu.Lock()
	op, ok := k.ops.byID[id]
	k.ops.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("operation %q: %w", id, ErrNotFound)
	}
	select {
	case <-op.done:
		return op.result, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// decode reads a call envelope as InvokeJSON does, returning the call and,
// for data that is no envelope, the refusal.
func (k *Kernel) decode(data []byte) (c *call, class, msg string) {
	c = &call{start: k.cfg.Now()}
	if int64(len(data)) > k.cfg.MaxEnvelopeBytes {
		c.env = &Envelope{}
		c.envHash = digest.Sum(data)
		return c, ErrInvalidArgs, fmt.Sprintf("envelope is %d bytes; the limit is %d", len(data), k.cfg.MaxEnvelopeBytes)
	}
	env, args, err := decodeEnvelope(data)
	if err != nil {
		c.env = salvage(data)
		c.envHash = digest.Sum(data)
		return c, ErrInvalidArgs, err.Error()
	}
	c.env, c.canonArgs = env, args
	return c, "", ""
}

// WaitBackground waits until every call begun by Start has finished, or
// ctx ends (its error is returned then).
func (k *Kernel) WaitBackground(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		k.background.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Drain prepares a shutdown: event subscriptions end (their channels
// close, and new ones start closed), and calls waiting for an approval
// give up with cancelled, as does every call that asks for one after
// Drain (it is recorded, and abandoned at once). Calls already executing
// are not touched; they commit or roll back as usual.
func (k *Kernel) Drain() {
	k.events.close()
	k.approvals.mu.Lock()
	k.approvals.draining = true
	pending := make([]*approval, 0, len(k.approvals.pending))
	for _, a := range k.approvals.pending {
		pending = append(pending, a)
	}
	k.approvals.mu.Unlock()
	for _, a := range pending {
		k.closeApproval(a, ApprovalAbandoned, "", "", shuttingDown)
	}
}

// shuttingDown is why Drain abandons approvals, those pending and those
// requested after it.
const shuttingDown = "the kernel is shutting down"
