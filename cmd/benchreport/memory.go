package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// memoryClients is the number of concurrent clients the memory section
// loads a kernel with.
const memoryClients = 200

// memoryBaseline is the commit whose kernelctl the memory section
// measures beside this tree's: the one issue 17 measured its figures on,
// before the lean-call work.
const memoryBaseline = "d880971"

// A memoryPoint is one kernel's load point at memoryClients with the
// resident memory of its process: before the load, the mean of samples
// taken while it ran, and the peak (VmHWM, since the process started).
type memoryPoint struct {
	Build            string // "" for this tree's kernelctl, else the commit built
	GOGC             string // "" for serve's own setting
	Load             point
	Idle, Mean, Peak int64 // bytes
}

// name says which kernel and GC setting m measured.
func (m memoryPoint) name() string {
	s := "this tree, GOGC unset (serve's own)"
	if m.Build != "" {
		s = m.Build + " (before), GOGC unset (serve's own)"
	}
	if m.GOGC != "" {
		s = strings.Replace(s, "GOGC unset (serve's own)", "GOGC="+m.GOGC, 1)
	}
	return s
}

// measureMemory serves a kernel per variant — this tree's with serve's
// own GC setting (GOGC unset) and with Go's default, and memoryBaseline's
// with its own — and runs memoryClients concurrent clients of the audited
// fs.read against each, sampling the process's resident memory from /proc
// every 50 ms. The baseline is left out, with a note on stderr, when it
// cannot be built (no git history, as in a shallow clone).
func (r *report) measureMemory(bin, tmp string, d time.Duration) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: memoryClients, MaxConnsPerHost: memoryClients}}
	defer client.CloseIdleConnections()
	variants := []memoryPoint{{}, {GOGC: "100"}}
	old, err := buildAt(memoryBaseline, tmp)
	if err != nil {
		step("memory: no baseline (%v)", err)
	} else {
		variants = append(variants, memoryPoint{Build: memoryBaseline})
	}
	for i, v := range variants {
		kernelctl := filepath.Join(bin, "kernelctl")
		if v.Build != "" {
			kernelctl = old
		}
		data, ws := filepath.Join(tmp, fmt.Sprintf("memory-%d", i)), filepath.Join(tmp, fmt.Sprintf("memory-ws-%d", i))
		if err := initKernel(filepath.Dir(kernelctl), data, ws); err != nil {
			return err
		}
		var env []string
		if v.GOGC != "" {
			env = []string{"GOGC=" + v.GOGC}
		}
		step("HTTP kernel fs.read at c=%d, %s", memoryClients, v.name())
		ks, err := startKernelEnv(env, kernelctl, data, "")
		if err != nil {
			return err
		}
		m, err := loadMemory(client, ks, data, ws, v.name(), d)
		ks.stop()
		if err != nil {
			return err
		}
		m.Build, m.GOGC = v.Build, v.GOGC
		r.Memory = append(r.Memory, m)
	}
	return nil
}

// buildAt builds kernelctl as of commit rev into tmp/<rev>/kernelctl,
// from a detached git worktree that it removes again.
func buildAt(rev, tmp string) (string, error) {
	src, out := filepath.Join(tmp, "src-"+rev), filepath.Join(tmp, rev)
	if err := sh(nil, "git", "worktree", "add", "--detach", src, rev); err != nil {
		return "", err
	}
	defer sh(nil, "git", "worktree", "remove", "--force", src)
	cmd := exec.Command("go", "build", "-o", filepath.Join(out, "kernelctl"), "./cmd/kernelctl")
	cmd.Dir, cmd.Stdout, cmd.Stderr = src, os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build of kernelctl at %s: %w", rev, err)
	}
	return filepath.Join(out, "kernelctl"), nil
}

// loadMemory runs the fs.read load on the served kernel ks and samples
// its memory.
func loadMemory(client *http.Client, ks *proc, data, ws, name string, d time.Duration) (memoryPoint, error) {
	tok, ph, err := benchToken(ks, data, kernel.TokenRequest{Tools: []string{"fs.read"}, FS: []captoken.FSRoot{{Path: ws, Mode: "r"}}})
	if err != nil {
		return memoryPoint{}, err
	}
	var m memoryPoint
	if m.Idle, err = procMemory(ks.pid, "VmRSS"); err != nil {
		return m, err
	}
	t := target{name: "kernel fs.read 1 KiB, " + name, url: ks.url + "/v1/syscalls", pid: ks.pid, want: []byte(`"status":"ok"`),
		body: sessionCall(tok, ph, "fs.read", same(`{"path":"a.txt"}`))}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sum, n int64
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if v, err := procMemory(ks.pid, "VmRSS"); err == nil {
					sum, n = sum+v, n+1
				}
			}
		}
	})
	m.Load, err = measure(client, t, memoryClients, time.Second, d)
	close(stop)
	wg.Wait()
	if err != nil {
		return m, err
	}
	if n > 0 {
		m.Mean = sum / n
	}
	m.Peak, err = procMemory(ks.pid, "VmHWM")
	return m, err
}

// procMemory reads one "kB" field (VmRSS, VmHWM, …) of
// /proc/PID/status, in bytes.
func procMemory(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k != field {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status: %s: %w", pid, field, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// mib formats bytes in MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f", float64(b)/(1<<20)) }

// memoryMarkdown is the report's section on the memory serve holds.
func (r *report) memoryMarkdown(w func(string, ...any)) {
	if len(r.Memory) == 0 {
		return
	}
	w("## 9. Memory held under %d clients", memoryClients)
	w("")
	w("`kernelctl serve` answering the audited fs.read of section 1–2 to %d concurrent clients (closed loop, a session each): this tree's kernel with serve's own GC target (GOGC unset; see serverGCPercent in cmd/kernelctl/serve.go) and with Go's default (GOGC=100), and the kernel as of %s, the commit issue 17 measured before the lean-call work, with its own. Resident memory of the server process from /proc: before the load, the mean of samples every 50 ms during it, and the peak since start (VmHWM).", memoryClients, memoryBaseline)
	w("")
	w("| kernel, GC setting | calls/s | p99 µs | server CPU µs/call | RSS idle MiB | RSS mean MiB | RSS peak MiB |")
	w("|---|---:|---:|---:|---:|---:|---:|")
	for _, m := range r.Memory {
		w("| %s | %s | %s | %s | %s | %s | %s |", m.name(), num(m.Load.Rate()), µs(m.Load.P99), µs(m.Load.ServerCPU), mib(m.Idle), mib(m.Mean), mib(m.Peak))
	}
	w("")
}
