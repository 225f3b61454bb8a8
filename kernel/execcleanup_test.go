package kernel

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// Work a syscall leaves (Call.Cleanup) runs in the background and is
// waited for before the call is answered; work left after that (an
// abandoned syscall's) still runs, not waited for.
func TestCleanups(t *testing.T) {
	var cl cleanups
	var done atomic.Int32
	release := make(chan struct{})
	cl.start(func() { <-release; done.Add(1) })
	cl.start(func() { done.Add(1) })
	waited := make(chan struct{})
	go func() { cl.wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("wait returned before the work was done")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-waited
	if n := done.Load(); n != 2 {
		t.Fatalf("%d of 2 done when wait returned", n)
	}
	late := make(chan struct{})
	cl.start(func() { close(late) })
	select {
	case <-late:
	case <-time.After(5 * time.Second):
		t.Fatal("work started after wait never ran")
	}
}

// Work left for after the answer (Call.After) does not start before wait
// has returned, starts then, and starts at once when left later.
func TestCleanupsAfterAnswer(t *testing.T) {
	var cl cleanups
	started := make(chan int, 2)
	cl.later(func() { started <- 1 })
	select {
	case <-started:
		t.Fatal("work for after the answer started before it")
	case <-time.After(50 * time.Millisecond):
	}
	cl.wait()
	cl.later(func() { started <- 2 })
	for _, want := range []int{1, 2} {
		select {
		case <-started:
		case <-time.After(5 * time.Second):
			t.Fatalf("work %d for after the answer never started", want)
		}
	}
}

// TestExecStartsNextSpare: proc.exec through Invoke leaves the start of
// the sandbox's next spare chain for after its answer (Call.After), and
// that start happens: a chain of the kernel's sandbox is waiting once the
// call is answered.
func TestExecStartsNextSpare(t *testing.T) {
	h := newExecHarness(t)
	mustOK(t, h.invoke("proc.exec", execArgs("true"), key("spare")))
	marker := filepath.Join(h.data, "sandbox") + "/"
	for deadline := time.Now().Add(10 * time.Second); len(procsWith(marker)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no spare chain of the kernel's sandbox after a proc.exec")
		}
	}
}
