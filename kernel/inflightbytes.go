package kernel

import (
	"fmt"
	"sync"
)

// MaxInflightBytesPerAgent and MaxInflightBytes bound the memory that
// calls hold from their admission (their token verified, their operation
// id taken) to their record, as waitingBytes estimates it: the calls of
// one agent with its sub-agents, and all calls. A call waiting for path
// locks, a net_bytes turn, its session's line or an approval holds its
// envelope (its args, provenance and every other member), decoded and
// canonical args and policy input all that time,
// and no other bound counted them: one agent parked 300 synchronous
// 1 MiB writes behind one held lock, 1.28 GB (rev14 F6). A call over
// either bound is refused at admission, concurrency_exceeded. The bounds
// are far above the approvals' (MaxPendingApprovalBytesPerAgent), whose
// waiting calls count here too, and no ordinary use nears them: 256 MiB
// is some 60 calls of the largest envelope at once, or 60,000 small ones.
const (
	MaxInflightBytesPerAgent int64 = 256 << 20
	MaxInflightBytes         int64 = 1 << 30
)

// inflightBytes counts the bytes of the calls admitted and not yet
// recorded, per agent family (agentFamily) and in all. Its zero value is
// ready: bounds of 0 are the constants' (tests lower them).
type inflightBytes struct {
	mu       sync.Mutex
	byFamily map[string]int64
	total    int64
	// perAgent and all are the bounds, when not the constants.
	perAgent, all int64
}

// admit counts the bytes of call c, its token verified, for c's agent
// family until release is called, once, after c's record; or, when they
// would take the family's or all calls' bytes over their bound, counts
// nothing and returns why, for the call's refusal.
func (b *inflightBytes) admit(c *call) (release func(), refused string) {
	n, family := waitingBytes(c), agentFamily(c.env.AgentID)
	b.mu.Lock()
	defer b.mu.Unlock()
	perAgent, all := b.perAgent, b.all
	if perAgent == 0 {
		perAgent = MaxInflightBytesPerAgent
	}
	if all == 0 {
		all = MaxInflightBytes
	}
	switch {
	case b.byFamily[family]+n > perAgent:
		return nil, fmt.Sprintf("the calls of %s (with its sub-agents) in flight hold %d MiB with this one, over the %d MiB one agent's may; retry once some have ended",
			family, (b.byFamily[family]+n)>>20, perAgent>>20)
	case b.total+n > all:
		return nil, fmt.Sprintf("the calls in flight hold %d MiB with this one, over the %d MiB all may; retry once some have ended", (b.total+n)>>20, all>>20)
	}
	if b.byFamily == nil {
		b.byFamily = map[string]int64{}
	}
	b.byFamily[family] += n
	b.total += n
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.byFamily[family] -= n; b.byFamily[family] <= 0 {
			delete(b.byFamily, family)
		}
		b.total -= n
	}, ""
}
