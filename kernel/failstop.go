package kernel

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/store"
	"github.com/capkernel/capkernel/txn"
)

// Fail stop. A failed commit of the bbolt file, a failed syncfs of the
// workspace or an apply that cannot be completed leaves the durable state
// unknown to this process (after a failed fsync, neither the file nor the
// page cache can be trusted). The kernel then accepts no more calls: the
// calls caught in the failure are answered internal with tx_outcome
// unknown, every later call is refused without running (internal, no_op,
// unrecorded), the
// failure is logged once, and the process that serves the kernel (kernelctl
// serve, mcp, run) exits non-zero so that its supervisor restarts it. The
// next Open decides every interrupted operation from what is durable
// (txn.Recover) and writes its one audit record. That Open reads files
// through the page cache and learns of no writeback error the failed
// process saw already, so only a restart after a remount of the failed
// file system (or a reboot) recovers from what is on the disk; the log
// line says so (docs/kernel.md).

// TxUnknown is the tx_outcome of an answer given when the kernel failed
// stop before it could learn or record the call's outcome: only the next
// start decides it. A repeat with the same idempotency key after the
// restart returns the decided outcome.
const TxUnknown = "unknown"

// Failed returns a channel closed when the kernel fails stop (see Err).
func (k *Kernel) Failed() <-chan struct{} { return k.db.Failed() }

// Err returns the durability failure the kernel stopped on, or nil: a
// *store.FatalError naming the failed operation and file.
func (k *Kernel) Err() error { return k.db.Err() }

// failStop makes the kernel fail stop with a failure of op on path.
func (k *Kernel) failStop(op, path string, err error) error {
	k.db.Fail(&store.FatalError{Op: op, Path: path, Err: err})
	return k.db.Err()
}

// watchFailure logs the failure the kernel stops on, once; it returns
// when the kernel fails or stop is closed.
func (k *Kernel) watchFailure(stop <-chan struct{}) {
	select {
	case <-k.db.Failed():
		msg, attrs := failureLog(k.db.Err())
		k.cfg.Logger.Error(msg, attrs...)
	case <-stop:
	}
}

// failureLog returns the message and attributes that log err, the
// failure the kernel stopped on, with what the operator is to do.
func failureLog(err error) (string, []any) {
	var f *store.FatalError
	switch {
	case errors.As(err, &f) && txn.Refused(f.Err):
		// Nothing about the disk is in doubt (an apply the file system
		// refused, ENOSPC of a rename included): a restart alone
		// recovers, reporting the effect as apply_refused.
		return "durability failure: the file system refused a committed effect, and the kernel accepts no more calls; restart it (no remount is needed): the next start reports the effect as apply_refused and serves",
			[]any{"op", f.Op, "path", f.Path, "error", f.Err.Error()}
	case f != nil:
		return "durability failure: the kernel accepts no more calls; remount the file system holding path (or reboot), then restart it to recover from what is durable",
			[]any{"op", f.Op, "path", f.Path, "error", f.Err.Error()}
	}
	return "durability failure: the kernel accepts no more calls", []any{"error", err.Error()}
}

// stopped is the answer to a call caught in a fail stop: internal, naming
// the failed operation and file, with tx_outcome unknown and no receipt
// (nothing about the call could be recorded; the next start decides it
// and writes its one record).
func (k *Kernel) stopped(c *call, err error) *Result {
	return k.unrecorded(c, fmt.Sprintf("the kernel failed stop: %v; this call's outcome is decided when the kernel restarts: "+
		"repeat it with the same idempotency_key then to learn it", err), TxUnknown)
}

// notRun is the answer to a call made after a fail stop: it did not run,
// so its tx_outcome is no_op, and nothing records it, now or at the next
// start (no receipt, no audit record): the message says so.
func (k *Kernel) notRun(c *call, err error) *Result {
	return k.unrecorded(c, fmt.Sprintf("the kernel had failed stop before this call: %v; the call did not run and is not recorded: "+
		"repeat it once the kernel has restarted", err), NoOp)
}

// unrecorded is an internal answer with message msg and outcome tx that
// no audit record or receipt backs.
func (k *Kernel) unrecorded(c *call, msg, tx string) *Result {
	c.fill(k)
	c.setOutcome(nil, ErrInternal, msg, tx)
	c.res.ReceiptID, c.res.Receipt, c.res.LedgerSeq, c.res.StateSnapshotID = "", nil, 0, ""
	c.res.ResultHash = resultHash(&c.res, nil)
	return &c.res
}

// applyAttempts bounds the tries at applying a committed call's staged
// effects (Apply is idempotent) before the kernel fails stop.
const applyAttempts = 3

// apply makes a committed call's effects visible (finish makes them
// durable, after the answer). When it cannot, the call is not answered ok
// while its effect is missing: the kernel fails stop and the next start
// redoes the apply from the durable intent. It returns nil on success,
// else the answer.
func (k *Kernel) apply(c *call, effects []txn.Effect, stage *txn.Stage) *Result {
	var err error
	for range applyAttempts {
		if err = txn.Apply(effects, stage.Root); err == nil {
			return nil
		}
		if errors.Is(err, txn.ErrNotDurable) {
			break // a second fsync would pass: see txn.ErrNotDurable
		}
	}
	op := "apply of committed operation " + c.env.OperationID + " to"
	if txn.Refused(err) {
		// No repair is needed: the next start reports the effect as
		// apply_refused and goes on. ENOSPC or EDQUOT from a rename or
		// mkdir is such a refusal (nothing was changed; staging checked
		// the room, so the file system was filled meanwhile): see
		// txn.Refused.
		op = "apply (refused for good by the file system: the next start reports it as apply_refused) of committed operation " +
			c.env.OperationID + " to"
	}
	return k.stopped(c, k.failStop(op, rootNames(stage), err))
}

// finish ends a committed and applied call after it is answered. The
// answer waits for no syncfs of the workspace: the commit is durable, and
// recovery redoes an apply from its intent (in commit order, over the
// pre-image only) until Finish ends the intent. So Finish is queued only
// once the applied effects are durable — a Finish durable before them
// would lose them in a crash — and a failed syncfs fails the kernel stop,
// leaving the redo to the next start. The syncfs is a SyncLater: it
// rides with the next call's sync of its staged files, or comes when a
// call waits for this one's path locks (pathLocks.onWait hurries it). The
// call's path locks, released by unlock, are held until Finish is queued,
// so that a later commit on the same paths lands in the same or a later
// transaction than the mark and recovery never redoes an earlier call
// over a later one's content.
func (k *Kernel) finish(opID string, stage *txn.Stage, unlock func()) {
	k.finishing.Add(1)
	k.syncer.SyncLater(func(err error) {
		defer k.finishing.Done()
		defer unlock()
		if err != nil {
			k.failStop("syncfs (making applied files durable) of", rootNames(stage), err)
			return
		}
		// Lazy: Finish rides in the next call's transaction, not a
		// commit of its own (store.UpdateLazy), and still lands in the
		// same or an earlier transaction than any commit queued after
		// unlock.
		k.db.UpdateLazy(func(tx *bbolt.Tx) error {
			defer k.onSequencer(time.Now())
			return txn.Finish(tx, opID)
		})
	}, stage.Roots()...)
}

// recordFailed answers a call whose commit could not be recorded. After a
// fail stop the commit may have reached the disk, so the staged files stay
// for recovery to apply or remove. Any other failure wrote nothing (the
// store rolled the transaction back), so the call is provably not
// committed and is rolled back now: its key is free again at once, unless
// settled (its external effect happened: rollback).
func (k *Kernel) recordFailed(ctx context.Context, c *call, in *txn.Intent, stage *txn.Stage, err error, settled bool) *Result {
	if store.IsFatal(err) {
		return k.stopped(c, err)
	}
	return k.rollback(ctx, c, in, stage, ErrInternal, "recording the commit failed: "+err.Error(), settled)
}

// unresolved answers a prepared call whose rollback (or outcome_unknown
// end) could not be recorded either. Its intent, and so its idempotency
// key, would stay in flight; the kernel fails stop instead, so that the
// next start ends the intent and writes its one audit record.
func (k *Kernel) unresolved(c *call, in *txn.Intent, err error) *Result {
	if !store.IsFatal(err) {
		err = k.failStop("recording the end of operation "+in.OperationID+" in", k.db.Path(), err)
	}
	return k.stopped(c, err)
}

// rootNames names the workspace roots of stage's effects.
func rootNames(stage *txn.Stage) string {
	var names []string
	for _, r := range stage.Roots() {
		names = append(names, r.Name())
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}
