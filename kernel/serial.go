package kernel

import "time"

// onSequencer adds the time since start to the kernel's serial time: the
// time its functions ran on the store's sequencer, whose one goroutine
// every durable write of the kernel waits for. Use it deferred at the top
// of such a function: defer k.onSequencer(time.Now()).
//
// It counts the kernel's own functions (the prepare and record steps of
// calls, the checkpoint at the end of each group commit), not bbolt's
// commit (its spill and rebalance time is in bbolt's TxStats) nor the
// fsync, which does not use the CPU.
func (k *Kernel) onSequencer(start time.Time) {
	k.serial.Add(int64(time.Since(start)))
}
