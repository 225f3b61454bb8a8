package kernel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// TestSandboxCrashChild is the child process of the sandbox crash tests:
// it opens the kernel (with the test policy) and runs the envelope; with
// CAPK_KILL_ON set it kills itself with SIGKILL once a process named
// CAPK_KILL_COMM whose command line holds that marker runs, otherwise it
// waits for the parent to kill it.
func TestSandboxCrashChild(t *testing.T) {
	data := os.Getenv("CAPK_SANDBOX_DATA")
	if data == "" {
		t.Skip("run by TestExecCrash and TestFetchCrash")
	}
	cfg := Config{DataDir: data, NetLookup: testLookup}
	execPolicy(t)(&cfg)
	k, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var env Envelope
	if err := json.Unmarshal([]byte(os.Getenv("CAPK_ENVELOPE")), &env); err != nil {
		t.Fatal(err)
	}
	env.PolicyHash = k.PolicyHash()
	done := make(chan *Result, 1)
	go func() { done <- k.Invoke(context.Background(), &env) }()
	marker, comm := os.Getenv("CAPK_KILL_ON"), os.Getenv("CAPK_KILL_COMM")
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		select {
		case r := <-done:
			t.Fatalf("the call finished: %+v", r)
		case <-time.After(10 * time.Millisecond):
		}
		if marker != "" && len(procsNamed(comm, marker)) > 0 {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
	}
	t.Fatal("never killed")
}

// procsNamed lists the processes named comm whose command line holds s.
func procsNamed(comm, s string) []int {
	var out []int
	for _, pid := range procsWith(s) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(b)) == comm {
			out = append(out, pid)
		}
	}
	return out
}

// runCrashChild runs TestSandboxCrashChild on h's data dir with env; the
// child kills itself once a process named comm holding marker runs; kill,
// when set, is called once the child runs and must kill it.
func runCrashChild(t *testing.T, h *harness, env Envelope, comm, marker string, kill func(*os.Process)) {
	t.Helper()
	envJSON, _ := json.Marshal(env)
	h.k.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSandboxCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), "CAPK_SANDBOX_DATA="+h.data, "CAPK_ENVELOPE="+string(envJSON), "CAPK_KILL_ON="+marker, "CAPK_KILL_COMM="+comm)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if kill != nil {
		kill(cmd.Process)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed: %v\n%s", err, out.String())
	}
}

// TestExecCrash kills the kernel with SIGKILL while a command runs (its
// intent is durable: recovery rolls it back), and while bwrap is still
// setting the sandbox up (the intent may not be durable yet: recovery
// rolls it back if it is, and nothing of the call is left either way).
func TestExecCrash(t *testing.T) {
	for _, tc := range []struct {
		name string
		comm string // the process whose start kills the kernel
		// rolledBack is the number of intents recovery must roll back; -1:
		// 0 or 1.
		rolledBack int
	}{
		{"command running", "sleep", 1},
		{"sandbox setting up", "bwrap", -1},
	} {
		t.Run(tc.name, func(t *testing.T) { testExecCrash(t, tc.comm, tc.rolledBack) })
	}
}

func testExecCrash(t *testing.T, comm string, rolledBack int) {
	h := newExecHarness(t)
	h.write("a.txt", "old\n")
	snap := snapshot(t, h.ws)
	marker := fmt.Sprintf("4242.%d", os.Getpid())
	env := Envelope{ToolID: "proc.exec", AgentID: h.agent, CapabilityToken: h.token, CapabilityTokenID: h.jti,
		IdempotencyKey: "crash", OperationID: newID(),
		Args: json.RawMessage(fmt.Sprintf(`{"argv":["sh","-c","echo new > a.txt; echo x > b.txt; mkdir d; exec sleep %s"]}`, marker))}
	// The command's argv is on its own command line only; bwrap's names the
	// kernel's /etc snapshot, under its sandbox directory.
	sandboxDir := filepath.Join(h.data, "sandbox") + "/"
	killOn := marker
	if comm == "bwrap" {
		killOn = sandboxDir
	}
	runCrashChild(t, h, env, comm, killOn, nil)

	h.open(execPolicy(t))
	// On reopen no process of the sandbox is left: it died with the kernel,
	// or (killed while bwrap was still setting it up) Open killed it.
	deadline := time.Now().Add(5 * time.Second)
	for len(procsWith(marker))+len(procsWith(sandboxDir)) > 0 {
		if time.Now().After(deadline) {
			var desc []string
			for _, pid := range append(procsWith(marker), procsWith(sandboxDir)...) {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
				status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
				var keep []string
				for _, l := range strings.Split(string(status), "\n") {
					if strings.HasPrefix(l, "PPid") || strings.HasPrefix(l, "NSpid") || strings.HasPrefix(l, "State") || strings.HasPrefix(l, "Uid") {
						keep = append(keep, l)
					}
				}
				desc = append(desc, fmt.Sprintf("%d %q %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " "), strings.Join(keep, "; ")))
			}
			t.Fatalf("orphan sandbox processes:\n%s", strings.Join(desc, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	rb := h.k.Recovered.RolledBack
	if rolledBack >= 0 && len(rb) != rolledBack || len(rb) > 1 || len(rb) == 1 && rb[0].OperationID != env.OperationID {
		t.Fatalf("recovery %+v", h.k.Recovered)
	}
	sameTree(t, snap, snapshot(t, h.ws))
	entries, _ := os.ReadDir(h.k.cfg.SandboxDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "capsandbox-run-") || strings.HasPrefix(e.Name(), "capk-proxy-") {
			t.Errorf("staging left after reopen: %s", filepath.Join(h.k.cfg.SandboxDir, e.Name()))
		}
	}
	if a := h.audits(0); len(rb) == 1 {
		if last := a[len(a)-1]; last.OperationID != env.OperationID || last.TxOutcome != RolledBack {
			t.Fatalf("last audit %+v", last)
		}
	} else if len(a) > 0 && a[len(a)-1].OperationID == env.OperationID {
		t.Fatalf("audit of a call that was never prepared %+v", a[len(a)-1])
	}
	// The key may be retried: it runs afresh.
	retry := h.invoke("proc.exec", nil, key("crash"), func(e *Envelope) {
		e.Args = json.RawMessage(`{"argv":["sh","-c","echo new > a.txt"]}`)
		e.IdempotencyKey = "crash"
	})
	if retry.Replayed || h.read("a.txt") != "new\n" {
		t.Fatalf("retry after a rolled-back crash: %+v", retry)
	}
}

// TestExecNetworkCrash kills the kernel while a command with network
// runs: its effect elsewhere may have happened, so recovery ends the call
// outcome_unknown (not rolled back: its key free for a repeat that would
// run it again), and applies nothing it wrote.
func TestExecNetworkCrash(t *testing.T) {
	h := newExecHarness(t)
	h.write("a.txt", "old\n")
	snap := snapshot(t, h.ws)
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Net: []string{"allowed.test"}})
	marker := fmt.Sprintf("4343.%d", os.Getpid())
	args := json.RawMessage(fmt.Sprintf(`{"argv":["sh","-c","echo new > a.txt; exec sleep %s"],"network":"allowlist"}`, marker))
	env := Envelope{ToolID: "proc.exec", AgentID: h.agent, CapabilityToken: h.token, CapabilityTokenID: h.jti,
		IdempotencyKey: "net-crash", OperationID: newID(), Args: args}
	runCrashChild(t, h, env, "sleep", marker, nil)
	h.open(execPolicy(t), func(c *Config) { c.NetLookup = testLookup })
	if len(h.k.Recovered.Unknown) != 1 || h.k.Recovered.Unknown[0].OperationID != env.OperationID || len(h.k.Recovered.RolledBack) != 0 {
		t.Fatalf("recovery %+v", h.k.Recovered)
	}
	sameTree(t, snap, snapshot(t, h.ws))
	for range 2 {
		r := h.invoke("proc.exec", nil, key("net-crash"), func(e *Envelope) { e.Args = args })
		if errClass(r) != ErrOutcomeUnknown || !r.Replayed || r.OperationID != env.OperationID {
			t.Fatalf("repeat %+v", r)
		}
	}
	if len(procsWith(marker)) > 0 {
		t.Fatal("the repeat ran the command again")
	}
}

func TestFetchCrash(t *testing.T) {
	h := newExecHarness(t)
	var posts atomic.Int32
	got := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			io.ReadAll(r.Body)
			posts.Add(1)
			got <- struct{}{}
			select { // the response never comes
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
			return
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, Net: []string{"127.0.0.1"}})
	args := json.RawMessage(fmt.Sprintf(`{"url":%q,"method":"POST","body":"charge card"}`, srv.URL+"/pay"))
	env := Envelope{ToolID: "net.fetch", AgentID: h.agent, CapabilityToken: h.token, CapabilityTokenID: h.jti,
		IdempotencyKey: "pay-1", OperationID: newID(), Args: args}
	runCrashChild(t, h, env, "", "", func(p *os.Process) {
		select {
		case <-got:
		case <-time.After(30 * time.Second):
			t.Error("the POST never arrived")
		}
		p.Kill()
	})
	h.open(execPolicy(t), func(c *Config) { c.NetLookup = testLookup })
	if len(h.k.Recovered.Unknown) != 1 || len(h.k.Recovered.RolledBack) != 0 {
		t.Fatalf("recovery %+v", h.k.Recovered)
	}
	a := h.audits(0)
	last := a[len(a)-1]
	if last.OperationID != env.OperationID || last.ErrorClass != ErrOutcomeUnknown {
		t.Fatalf("recovery audit %+v", last)
	}
	// The replay says so and is never re-sent.
	for range 2 {
		r := h.invoke("net.fetch", nil, key("pay-1"), func(e *Envelope) { e.Args = args })
		if errClass(r) != ErrOutcomeUnknown || !r.Replayed || r.OperationID != env.OperationID {
			t.Fatalf("replay %+v", r)
		}
	}
	if n := posts.Load(); n != 1 {
		t.Fatalf("the POST was sent %d times", n)
	}
	if rep, err := h.k.Inspector().ReplayVerify(); err != nil || len(rep.Problems) > 0 {
		t.Fatalf("replay verify: %v %+v", err, rep)
	}
}

// TestFetchGetCrash: a net.fetch GET, with or without an idempotency
// key, whose request (its URL carrying data) reached the server, is
// recorded by recovery as outcome_unknown when the kernel dies before it
// answers: it is prepared durably before it is sent, as a mutating call
// is (a keyless read took the direct path, which writes nothing before it
// runs, and the request left no record). Being a read it leaves its key
// free: a repeat with the key runs again (it is not bound to the unknown
// outcome, as a POST's is).
func TestFetchGetCrash(t *testing.T) {
	for _, idem := range []string{"", "get-1"} {
		t.Run("key "+idem, func(t *testing.T) {
			h := newExecHarness(t)
			got := make(chan string, 2)
			var answer atomic.Bool // the GET hangs until the kernel is killed
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.URL.RawQuery
				if !answer.Load() {
					select { // the response never comes
					case <-r.Context().Done():
					case <-time.After(20 * time.Second):
					}
					return
				}
				w.Write([]byte("fresh"))
			}))
			defer srv.Close()
			h.token, h.jti = h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, Net: []string{"127.0.0.1"}})
			args := json.RawMessage(fmt.Sprintf(`{"url":%q}`, srv.URL+"/leak?d=secret"))
			env := Envelope{ToolID: "net.fetch", AgentID: h.agent, CapabilityToken: h.token, CapabilityTokenID: h.jti,
				OperationID: newID(), Args: args, IdempotencyKey: idem}
			runCrashChild(t, h, env, "", "", func(p *os.Process) {
				select {
				case q := <-got:
					if q != "d=secret" {
						t.Errorf("the server got %q", q)
					}
				case <-time.After(30 * time.Second):
					t.Error("the GET never arrived")
				}
				p.Kill()
			})
			answer.Store(true)
			h.open(execPolicy(t), func(c *Config) { c.NetLookup = testLookup })
			if len(h.k.Recovered.Unknown) != 1 {
				t.Fatalf("recovery %+v", h.k.Recovered)
			}
			var records []auditRecord
			for _, a := range h.audits(0) {
				if a.OperationID == env.OperationID {
					records = append(records, a)
				}
			}
			if len(records) != 1 || records[0].ErrorClass != ErrOutcomeUnknown {
				t.Fatalf("the records of the GET that went out: %+v", records)
			}
			if idem != "" {
				r := h.invoke("net.fetch", nil, key(idem), func(e *Envelope) { e.Args = args })
				if r.Status != StatusOK || r.Replayed {
					t.Fatalf("the GET repeated with its key: %+v replayed %v", r.Error, r.Replayed)
				}
			}
		})
	}
}
