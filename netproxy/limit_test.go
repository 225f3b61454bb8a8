package netproxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// floodEnv names the socket a re-executed test binary floods (see TestMain):
// the flooding client must be another process, or its own descriptors
// would be counted with the proxy's.
const floodEnv = "NETPROXY_TEST_FLOOD_SOCK"

// floodConns is how many connections the flooding process opens.
const floodConns = 3000

func TestMain(m *testing.M) {
	if sock := os.Getenv(floodEnv); sock != "" {
		flood(sock)
		return
	}
	os.Exit(m.Run())
}

// flood waits for a line on stdin, then opens up to floodConns
// connections to the unix socket sock and holds them, sending nothing; it
// prints "held N" once done and exits (closing them all) when its stdin
// ends. A connect that finds the listen queue full fails at once (Go's
// connect does not block) and is not retried.
func flood(sock string) {
	in := bufio.NewReader(os.Stdin)
	if _, err := in.ReadString('\n'); err != nil {
		os.Exit(1)
	}
	var held []net.Conn
	for range floodConns {
		c, err := net.Dial("unix", sock)
		if err != nil {
			continue
		}
		held = append(held, c)
	}
	fmt.Printf("held %d\n", len(held))
	io.Copy(io.Discard, in)
	os.Exit(0)
}

// startFlood starts the flooding process against sock. Calling the
// returned go makes it flood and returns how many connections it holds;
// stop ends it (and them).
func startFlood(t *testing.T, sock string) (goFlood func() int, stop func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), floodEnv+"="+sock)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = sync.OnceFunc(func() {
		stdin.Close()
		cmd.Wait()
	})
	t.Cleanup(stop)
	goFlood = func() int {
		t.Helper()
		if _, err := io.WriteString(stdin, "go\n"); err != nil {
			t.Fatalf("flooding process: %v", err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		n, aerr := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "held "))
		if err != nil || aerr != nil {
			t.Fatalf("flooding process said %q: %v %v", line, err, aerr)
		}
		return n
	}
	return goFlood, stop
}

// fds is the number of descriptors this process holds.
func fds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// getAllowed makes one allowed plain-HTTP request through the proxy and
// fails the test unless the origin answers it.
func getAllowed(t *testing.T, f *fixture) {
	t.Helper()
	resp, err := f.client().Get(fmt.Sprintf("http://allowed.test:%d/echo", port(f.plain)))
	if err != nil {
		t.Fatalf("allowed request after the flood: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "host=allowed.test:") {
		t.Fatalf("allowed request after the flood: %s %q", resp.Status, body)
	}
}

// TestConnLimitBoundsDescriptors: another process opens thousands of
// connections to the proxy and holds them; the proxy accepts only
// MaxConns (default 64) of them, so the descriptors this process holds
// stay bounded, and once the flood ends the proxy serves an allowed
// request.
func TestConnLimitBoundsDescriptors(t *testing.T) {
	const maxConns, slack = 64, 16
	f := newFixture(t, 0, allowHosts("allowed.test"))
	goFlood, stop := startFlood(t, f.proxy.SocketPath())
	base := fds(t)
	held := goFlood()
	if held <= maxConns+slack {
		t.Fatalf("the flood held only %d connections; the test needs more than %d", held, maxConns+slack)
	}
	// The proxy accepts what it will within milliseconds; watch a while.
	peak := 0
	for range 30 {
		peak = max(peak, fds(t))
		time.Sleep(10 * time.Millisecond)
	}
	if peak > base+maxConns+slack {
		t.Fatalf("%d connections held by the flood: this process went from %d to %d descriptors, want at most %d more",
			held, base, peak, maxConns+slack)
	}
	t.Logf("flood of %d connections: descriptors %d -> peak %d", held, base, peak)
	stop()
	getAllowed(t, f)
}

// TestAcceptOutOfDescriptors: an Accept that fails with EMFILE (this
// process's descriptor limit reached while the flood waits) pauses and
// retries; the proxy keeps serving once descriptors are free again.
func TestAcceptOutOfDescriptors(t *testing.T) {
	f := newFixture(t, 0, allowHosts("allowed.test"))
	goFlood, stop := startFlood(t, f.proxy.SocketPath())
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	// A few descriptors above what the process holds now, far below the
	// flood: the proxy's accepts run into EMFILE.
	low := lim
	low.Cur = uint64(fds(t) + 4)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer restore()
	held := goFlood()
	// Pause over several retries (5, 10, 20, 40, 80 ms …).
	time.Sleep(300 * time.Millisecond)
	restore()
	t.Logf("flood of %d connections under a limit of %d descriptors", held, low.Cur)
	stop()
	getAllowed(t, f)
}
