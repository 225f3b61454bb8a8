package kernel

import (
	"context"
	"slices"
	"sync"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// A call that spends net_bytes cannot know before it runs how much it
// will spend: it reads what is left of the budget when it starts, spends
// up to that (net.fetch caps the body it reads to it, proc.exec's proxy
// relays no byte past it), and is charged what it spent when it is
// recorded. Two such calls of one account running together would each
// see the whole rest and overspend it together (found by review: 20
// concurrent POSTs under net_bytes=600 all went out, 5540 bytes
// charged). So the calls that may spend net_bytes of an account that
// limits it take turns: each holds the account from before it reads what
// is left until its charge is recorded (commit, rollback or settle), and
// the next one reads what the last one left. The accounts are the call's
// token and every ancestor (txn.Account), so children sharing a parent's
// limit take turns with each other and with the parent. Calls of tokens
// without a net_bytes limit anywhere in their chain hold nothing.

// netBudgetLocks are the turns of the accounts that limit net_bytes, by
// token id. The zero value is ready to use.
type netBudgetLocks struct {
	mu   sync.Mutex
	turn map[string]*netTurn
}

// netTurn is one account's turn: holding it is having sent on ch.
type netTurn struct {
	ch      chan struct{} // capacity 1
	holders int           // calls holding or waiting for it
}

// hold waits for the turn of every account of c that limits net_bytes
// when c may spend it, in token id order (so that two calls of one
// family never hold one account each while waiting for the other's), and
// returns the function that gives them back. It costs nothing for a call
// that cannot spend net_bytes or whose accounts do not limit it. A call
// whose ctx ends while it waits holds nothing and gets its refusal
// (cancelled, or timeout): it has not run.
//
// Call it after the call's path locks are held (pathLocks): a call
// holding a turn never waits for a path lock, so the two cannot
// deadlock.
func (l *netBudgetLocks) hold(ctx context.Context, c *call) (release func(), refused *Error) {
	ids := c.netBudgetAccounts()
	if len(ids) == 0 {
		return func() {}, nil
	}
	held := make([]*netTurn, 0, len(ids))
	release = func() {
		for i, t := range held {
			<-t.ch
			l.leave(ids[i], t)
		}
	}
	for _, id := range ids {
		t := l.join(id)
		select {
		case t.ch <- struct{}{}:
			held = append(held, t)
		case <-ctx.Done():
			l.leave(id, t)
			release()
			class, msg := ctxClass(ctx, "waiting for the turn of a net_bytes budget (calls that spend one budget run one at a time)")
			return nil, &Error{Class: class, Message: msg}
		}
	}
	return release, nil
}

// join counts one more holder of id's turn and returns it.
func (l *netBudgetLocks) join(id string) *netTurn {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.turn == nil {
		l.turn = map[string]*netTurn{}
	}
	t := l.turn[id]
	if t == nil {
		t = &netTurn{ch: make(chan struct{}, 1)}
		l.turn[id] = t
	}
	t.holders++
	return t
}

// leave counts one holder of id's turn less, forgetting the turn when
// none is left.
func (l *netBudgetLocks) leave(id string, t *netTurn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.holders--; t.holders == 0 {
		delete(l.turn, id)
	}
}

// netBudgetAccounts returns, sorted and without repeats, the token ids of
// c's accounts that limit net_bytes, when c may spend it: a call that
// connects to hosts (net.fetch) or runs with the allowlist posture
// (proc.exec: its proxy counts the bytes). Nil otherwise.
func (c *call) netBudgetAccounts() []string {
	if c.grant == nil || c.reach == nil || (len(c.reach.Hosts) == 0 && c.grant.Network != syscalls.NetAllowlist) {
		return nil
	}
	var ids []string
	for _, a := range c.accounts() {
		if _, ok := a.Limits[txn.BudgetNetBytes]; ok {
			ids = append(ids, a.TokenID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}
