package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// waitLineEvery is how often a call held for an approval says it still
// waits.
const waitLineEvery = 15 * time.Second

// decisionGrace bounds how long a held call, once answered, waits for its
// approval's decision event to print it.
const decisionGrace = 2 * time.Second

// followTimeout bounds how long a call waits for the event stream to open
// before it is sent anyway (unannounced, should it be held).
const followTimeout = 3 * time.Second

// announceApproval follows the kernel's confirmation events of agent's
// operation op through c and, should the call be held for an approval,
// writes to w at once the operation and approval ids and how to decide
// it, then a line every waitLineEvery while it waits, and the decision. It
// returns once the stream is open (or could not be opened: the call is
// made all the same) with stop, which ends the following once the call is
// done: after the decision's line, when the call was held, for up to
// decisionGrace (its event can arrive just after the call's result).
func announceApproval(ctx context.Context, c *httpapi.Client, agent, op string, w io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	ready := make(chan struct{})
	var once sync.Once
	open := func() { once.Do(func() { close(ready) }) }
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer open()
		var ticker *time.Ticker
		var since time.Time
		var held string
		var grace <-chan time.Time
		doneCh := done
		tick := make(chan time.Time)
		defer func() {
			if ticker != nil {
				ticker.Stop()
			}
		}()
		events := make(chan kernel.Event, 4)
		go func() {
			defer close(events)
			f := kernel.EventFilter{AgentID: agent, Kinds: []string{kernel.EventConfirmationRequested, kernel.EventConfirmationResolved}}
			c.Follow(ctx, f, open, func(e kernel.Event) error {
				if e.OperationID == op && e.Approval != nil {
					select {
					case events <- e:
					case <-ctx.Done():
					}
				}
				return nil
			}, nil)
		}()
		for {
			var tc <-chan time.Time = tick
			if ticker != nil {
				tc = ticker.C
			}
			select {
			case e, ok := <-events:
				if !ok {
					return
				}
				a := e.Approval
				if e.Kind == kernel.EventConfirmationRequested {
					held, since = a.ID, time.Now()
					fmt.Fprintf(w, "operation %s waits for approval %s (%s, needs an approver with role %s; decide by %s)\n"+
						"  decide: kernelctl approvals approve %s --token APPROVER_TOKEN_FILE (or deny), with --server or --data of this kernel\n",
						op, a.ID, a.Mode, a.RequiredRole, seconds(a.DecideBy), a.ID)
					ticker = time.NewTicker(waitLineEvery)
					continue
				}
				if a.DecidedBy == "" { // expired or abandoned: the kernel's doing
					fmt.Fprintf(w, "approval %s: %s: %s\n", a.ID, a.State, orDash(a.Reason))
				} else {
					fmt.Fprintf(w, "approval %s: %s by %s\n", a.ID, a.State, a.DecidedBy)
				}
				return
			case <-tc:
				fmt.Fprintf(w, "still waiting for approval %s (%s so far)\n", held, time.Since(since).Round(time.Second))
			case <-doneCh:
				if held == "" {
					return
				}
				doneCh, grace = nil, time.After(decisionGrace)
			case <-grace:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(followTimeout):
	}
	return func() { close(done); wg.Wait(); cancel() }
}

// seconds shortens an RFC 3339 time to whole seconds, for people.
func seconds(ts string) string {
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return ts
	}
	return t.UTC().Format(time.RFC3339)
}
