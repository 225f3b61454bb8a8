package kernel

import (
	"context"
	"errors"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/syscalls"
	"github.com/capkernel/capkernel/txn"
)

// Preconditions on calls outside a transaction: the refs must hold on every
// call that carries them, read or write, keyed or not. A call
// with an idempotency key or a mutating class is checked by txn at prepare
// and again at commit; a direct call (a read without a key) is checked
// here, with the same locks the transactional path takes:
//
//   - holdPreconditions locks the call's fs paths and the kv keys it reads
//     or names, then checks every ref before the syscall runs, so a read
//     never sees a file or key change between its check and its effect;
//   - storedRefs checks the kv and ledger refs again in the transaction that
//     records the call, so a ledger:head ref holds at the point the call
//     enters the ledger (no lock orders the ledger; its transaction does).

// holdPreconditions takes the locks of a direct call that carries
// precondition refs and checks them. It returns the function releasing the
// locks (a no-op for a call without refs) and, when a ref does not hold
// or the locks are more than MaxLockKeys, the error class and message.
func (k *Kernel) holdPreconditions(ctx context.Context, c *call, resources []*syscalls.Resource) (unlock func(), class, msg string) {
	if len(c.env.PreconditionRefs) == 0 {
		return func() {}, "", ""
	}
	var fsKeys, kvKeys []string
	for _, r := range c.fs {
		fsKeys = append(fsKeys, r.LockNames()...)
	}
	for _, r := range resources {
		if r.Root == nil {
			kvKeys = append(kvKeys, "kv:"+r.Rel)
		}
	}
	for _, p := range c.env.PreconditionRefs {
		if kind, name := p.Target(); kind == txn.RefKV {
			kvKeys = append(kvKeys, "kv:"+name)
		}
	}
	locks, err := k.locks.plan(fsKeys, kvKeys)
	if err != nil {
		return func() {}, ErrInvalidArgs, err.Error()
	}
	if err := k.locks.lock(ctx, locks); err != nil {
		class, msg = ctxClass(ctx, "while it waited for its paths' locks, before it ran")
		return func() {}, class, msg
	}
	unlock = func() { k.locks.unlock(locks) }
	if class, msg = c.checkFiles(); class != "" {
		return unlock, class, msg
	}
	err = k.db.View(func(tx *bbolt.Tx) error {
		class, msg = c.storedRefs(tx)
		return nil
	})
	if err != nil {
		return unlock, ErrInternal, err.Error()
	}
	return unlock, class, msg
}

// storedRefs checks the call's kv and ledger precondition refs in tx.
func (c *call) storedRefs(tx *bbolt.Tx) (class, msg string) {
	if len(c.env.PreconditionRefs) == 0 {
		return "", ""
	}
	err := txn.CheckStored(tx, c.env.PreconditionRefs)
	var te *txn.Error
	switch {
	case errors.As(err, &te):
		return te.Class, te.Message
	case err != nil:
		return ErrInternal, err.Error()
	}
	return "", ""
}
