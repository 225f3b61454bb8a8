package kernel

import (
	"context"
	"time"
)

// Stages of the pipeline whose latency an Observer sees. Each stage is the
// time from the end of the one before it (or the call's start) to its own
// end, so a call's stages add up to its whole latency:
//
//   - verify: the envelope, the capability token, the tool, the arguments
//     and the resources (steps 1-5 of invoke.go);
//   - policy: the policy decision (step 6);
//   - gate: the replay lookup, the approval wait, if any, and the session's
//     concurrency slot (steps 7-8);
//   - prepare: path locks and the prepare transaction (transactional
//     calls);
//   - execute: the syscall itself, and making its staged files durable;
//   - ledger: the group commit that records the call — commit decision,
//     audit record, receipt and fsync — and, for a call refused midway,
//     the rest of the stage it was refused in;
//   - commit: applying a committed transaction's staged files to the
//     workspace after its record is durable.
const (
	StageVerify  = "verify"
	StagePolicy  = "policy"
	StageGate    = "gate"
	StagePrepare = "prepare"
	StageExecute = "execute"
	StageLedger  = "ledger"
	StageCommit  = "commit"
)

// Stages are the stages a call may pass through, in pipeline order; a
// call reports each at most once.
var Stages = [...]string{StageVerify, StagePolicy, StageGate, StagePrepare, StageExecute, StageLedger, StageCommit}

// StageSpan is the time one stage of a call took.
type StageSpan struct {
	Stage string
	Start time.Time
	End   time.Time
}

// CallReport is what an Observer learns of one finished call.
type CallReport struct {
	OperationID  string
	ToolID       string
	AgentID      string
	SessionID    string
	TokenID      string // the capability token's jti, when it verified
	SideEffect   string // the call's class; empty when refused before step 4
	AutonomyMode string // the effective mode; empty when refused before step 6
	Status       string // ok or error
	ErrorClass   string
	ErrorMessage string // the error's message, when Status is error; NotKeptMessage for a call audited at depth commitments_only
	TxOutcome    string
	LedgerSeq    uint64 // the sequence number of the call's audit record; 0 if none
	Replayed     bool
	Start, End   time.Time
	Stages       []StageSpan // in pipeline order; only stages the call reached
	// Provenance is the envelope's provenance object (W3C trace context
	// travels there as "traceparent" and "tracestate").
	Provenance []byte
	// Context is the context the call was made with (for Start, the
	// starting request's), never nil: an Observer reads values from it,
	// such as a transport's trace context, and must not wait on it, since
	// it may be cancelled by the time the call is reported.
	Context context.Context
}

// Outcome is "ok" for a call that succeeded, else its error class.
func (r *CallReport) Outcome() string {
	if r.Status != StatusOK {
		return r.ErrorClass
	}
	return "ok"
}

// An Observer is told about each finished call and each group commit, for
// metrics and traces. Its methods run on the call's goroutine (CallDone)
// and on the store's sequencer (GroupCommit), so they must be quick and
// must not call back into the kernel.
type Observer interface {
	// CallDone reports a call after its result is final, before it is
	// returned.
	CallDone(r *CallReport)
	// GroupCommit reports one write transaction of the store: how many
	// writes it carried and how long the transaction took, fsync
	// included.
	GroupCommit(batch int, took time.Duration)
}

// observation is the stage clock of one call, kept only when the kernel
// has an Observer.
type observation struct {
	last   time.Time
	stages []StageSpan
}

// observe starts the stage clock of c if the kernel has an Observer.
func (k *Kernel) observe(c *call) {
	if k.cfg.Observer != nil && c.obs == nil {
		c.obs = &observation{last: c.start, stages: make([]StageSpan, 0, 7)}
		if c.obs.last.IsZero() {
			c.obs.last = time.Now()
		}
	}
}

// lap ends stage of c now: the stage began where the previous one ended.
func (c *call) lap(stage string) {
	if c.obs == nil {
		return
	}
	now := time.Now()
	c.obs.stages = append(c.obs.stages, StageSpan{Stage: stage, Start: c.obs.last, End: now})
	c.obs.last = now
}

// observed reports call c, whose result is r, to the Observer: the time
// since the last stage goes to commit after a transaction's record, and
// to ledger otherwise (the record of every call ends its pipeline).
func (k *Kernel) observed(c *call, r *Result, own bool) {
	o := k.cfg.Observer
	if o == nil {
		return
	}
	k.observe(c)
	rest := StageLedger
	if n := len(c.obs.stages); n > 0 && c.obs.stages[n-1].Stage == StageLedger {
		rest = StageCommit
	}
	c.lap(rest)
	rep := &CallReport{
		OperationID: c.env.OperationID, ToolID: c.env.ToolID, AgentID: c.agent(), SessionID: c.session,
		SideEffect: string(c.effect), AutonomyMode: r.AutonomyMode, Status: r.Status,
		TxOutcome: r.TxOutcome, LedgerSeq: r.LedgerSeq, Replayed: r.Replayed, Stages: c.obs.stages, Provenance: c.env.Provenance,
		Context: c.caller,
	}
	if rep.Context == nil {
		rep.Context = context.Background()
	}
	if c.token != nil {
		rep.TokenID = c.token.Claims.ID
	}
	if r.Error != nil {
		rep.ErrorClass, rep.ErrorMessage = r.Error.Class, r.Error.Message
		if own {
			rep.ErrorMessage = NotKeptMessage // see Event.own: logs keep no part of the call
		}
	}
	rep.Start, rep.End = c.obs.stages[0].Start, c.obs.last
	o.CallDone(rep)
}

// groupCommit passes the store's group-commit report to the Observer.
func (k *Kernel) groupCommit(batch int, took time.Duration) {
	k.commits.Add(1)
	if o := k.cfg.Observer; o != nil {
		o.GroupCommit(batch, took)
	}
}
