package sandbox

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// setInit takes only bwrap's own child in a pid namespace of its own: a
// pid in another namespace that is not the chain's child (whatever an
// info fd said) is refused, so the kernel never limits, moves or kills a
// process that is not the run's.
func TestSetInitOnlyChild(t *testing.T) {
	start := func(args ...string) *exec.Cmd {
		c := exec.Command(args[0], args[1:]...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c
	}
	chain := start("unshare", "--user", "--map-root-user", "--pid", "--fork", "sleep", "30")
	other := start("unshare", "--user", "--map-root-user", "--pid", "--fork", "sleep", "31")
	child := func(c *exec.Cmd) int {
		for i := 0; i < 100; i++ {
			pid := strconv.Itoa(c.Process.Pid)
			b, _ := os.ReadFile("/proc/" + pid + "/task/" + pid + "/children")
			if f := strings.Fields(string(b)); len(f) == 1 {
				n, _ := strconv.Atoi(f[0])
				if pidNS(n) != 0 && pidNS(n) != pidNS(c.Process.Pid) {
					return n
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("no child of %d in its own pid namespace", c.Process.Pid)
		return 0
	}
	k := &killer{proc: chain.Process}
	if k.setInit(child(other)) {
		t.Fatal("took another chain's child as the sandbox's init")
	}
	if !k.setInit(child(chain)) {
		t.Fatal("refused the chain's own child")
	}
	if init, _ := k.sandboxInit(); init != child(chain) {
		t.Fatalf("init %d", init)
	}
}
