package kernel

import "sync"

// cleanups is the work a syscall leaves running when it returns
// (syscalls.Call.Cleanup): proc.exec's removal of its sandbox staging,
// which needs no part of the call's outcome, runs while the call is
// recorded (its fsync) instead of before; run waits for it before it
// answers, so nothing of the call is left once it has its result. And
// the work it leaves for after the answer (syscalls.Call.After):
// proc.exec's start of the sandbox's next spare chain, which would
// otherwise compete with the record's commit for the CPU.
type cleanups struct {
	mu      sync.Mutex
	running []chan struct{}
	waited  bool     // wait has begun: later work is not waited for
	after   []func() // Call.After's, until answered
	done    bool     // wait has returned: Call.After's work starts at once
}

// start runs f in a goroutine of its own.
func (cl *cleanups) start(f func()) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.waited {
		// A syscall abandoned after its timeout; the call is answered.
		go f()
		return
	}
	done := make(chan struct{})
	cl.running = append(cl.running, done)
	go func() {
		defer close(done)
		f()
	}()
}

// wait waits for the work started so far, then starts the work left for
// after the answer (later): run calls it as it answers.
func (cl *cleanups) wait() {
	cl.mu.Lock()
	cl.waited = true
	running := cl.running
	cl.mu.Unlock()
	for _, done := range running {
		<-done
	}
	cl.mu.Lock()
	cl.done = true
	after := cl.after
	cl.after = nil
	cl.mu.Unlock()
	for _, f := range after {
		go f()
	}
}

// later runs f in a goroutine of its own once the call is answered (wait
// has returned), or at once if it is.
func (cl *cleanups) later(f func()) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.done {
		go f()
		return
	}
	cl.after = append(cl.after, f)
}
