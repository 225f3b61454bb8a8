package kernel

import (
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestExecOnKilledSpare: a spare chain of the kernel's sandbox killed from
// outside (SIGKILL) just before a proc.exec, so not yet reaped when the
// call takes it, does not fail the call: nothing of the command had run,
// and the sandbox runs it on a fresh chain.
func TestExecOnKilledSpare(t *testing.T) {
	h := newExecHarness(t)
	mustOK(t, h.invoke("proc.exec", execArgs("true"), key("first")))
	marker := filepath.Join(h.data, "sandbox") + "/"
	for i := range 3 {
		var spares []int
		for deadline := time.Now().Add(10 * time.Second); len(spares) == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("no spare chain of the kernel's sandbox")
			}
			spares = procsWith(marker)
		}
		for _, pid := range spares {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		e := decodeExec(t, h.invoke("proc.exec", execArgs("echo", "ran"), key(fmt.Sprint("after-kill-", i))))
		if e.ExitCode != 0 || e.Stdout != "ran\n" {
			t.Fatalf("call %d after its spare was killed: %+v", i, e)
		}
	}
}
