package ledger

import (
	"fmt"

	"github.com/zeebo/blake3"
)

// The readers of a whole ledger (Verify, Export) read the stored bytes
// where bbolt maps them. On a damaged file — an element whose size a
// flipped bit made point past the file's end — that read faults, and a
// fault in a mapped file ends the process (SIGBUS, a fatal runtime error)
// unless the goroutine has debug.SetPanicOnFault set: then it is a panic
// whose value has an Addr method, which these readers recover and report
// as damage where it was met, naming what they were reading.

// faultError returns the error a recovered panic value p stands for when
// it is a fault reading memory, and false for any other panic, which the
// caller panics with again.
func faultError(p any) (error, bool) {
	f, ok := p.(interface{ Addr() uintptr })
	if !ok {
		return nil, false
	}
	return fmt.Errorf("the stored bytes cannot be read (a fault at address %#x reading the mapped file): the file is damaged", f.Addr()), true
}

// prepareGuarded is prepare, with a fault reading the item's stored bytes
// reported as the item's error. Its goroutine has SetPanicOnFault set.
func (it *item) prepareGuarded(opts *VerifyOptions, unpacked *[]byte, leaf *blake3.Hasher) {
	defer func() {
		if p := recover(); p != nil {
			err, ok := faultError(p)
			if !ok {
				panic(p)
			}
			it.err = err
		}
	}()
	it.prepare(opts, unpacked, leaf)
}

// guardFaults, deferred with SetPanicOnFault(true) set, turns a fault on
// the goroutine into *err (what, a description of what was read, names
// it); other panics go on.
func guardFaults(err *error, what func() string) {
	p := recover()
	if p == nil {
		return
	}
	e, ok := faultError(p)
	if !ok {
		panic(p)
	}
	*err = fmt.Errorf("ledger: %s: %w", what(), e)
}
