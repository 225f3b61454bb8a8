package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
)

// memoryClients is the number of concurrent clients the memory section
// loads a kernel with.
const memoryClients = 200

// A memoryPoint is one kernel's load point at memoryClients with the
// resident memory of its process: before the load, the mean of samples
// taken while it ran, and the peak (VmHWM, since the process started).
type memoryPoint struct {
	GOGC             string // "" for serve's own setting
	Load             point
	Idle, Mean, Peak int64 // bytes
}

// memoryVariants are the GC settings compared: serve's own (GOGC unset)
// against Go's default.
var memoryVariants = []string{"", "100"}

// measureMemory serves a kernel per GC setting and runs memoryClients
// concurrent clients of the audited fs.read against it, sampling the
// process's resident memory from /proc every 50 ms.
func (r *report) measureMemory(bin, tmp string, d time.Duration) error {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: memoryClients, MaxConnsPerHost: memoryClients}}
	defer client.CloseIdleConnections()
	for _, gogc := range memoryVariants {
		name := "GOGC unset"
		if gogc != "" {
			name = "GOGC=" + gogc
		}
		data, ws := filepath.Join(tmp, "memory-"+name), filepath.Join(tmp, "memory-ws-"+name)
		if err := initKernel(bin, data, ws); err != nil {
			return err
		}
		var env []string
		if gogc != "" {
			env = []string{"GOGC=" + gogc}
		}
		step("HTTP kernel fs.read at c=%d, %s", memoryClients, name)
		ks, err := startKernelEnv(env, filepath.Join(bin, "kernelctl"), data, "")
		if err != nil {
			return err
		}
		m, err := loadMemory(client, ks, data, ws, name, d)
		ks.stop()
		if err != nil {
			return err
		}
		m.GOGC = gogc
		r.Memory = append(r.Memory, m)
	}
	return nil
}

// loadMemory runs the fs.read load on the served kernel ks and samples
// its memory.
func loadMemory(client *http.Client, ks *proc, data, ws, name string, d time.Duration) (memoryPoint, error) {
	admin, err := os.ReadFile(filepath.Join(data, kernel.AdminFile))
	if err != nil {
		return memoryPoint{}, err
	}
	ctx := context.Background()
	c := &httpapi.Client{BaseURL: ks.url, Credential: strings.TrimSpace(string(admin))}
	tok, err := c.Mint(ctx, kernel.TokenRequest{AgentID: "bench", Tools: []string{"fs.read"}, FS: []captoken.FSRoot{{Path: ws, Mode: "r"}}})
	if err != nil {
		return memoryPoint{}, fmt.Errorf("mint: %w", err)
	}
	ph, err := c.PolicyHash(ctx)
	if err != nil {
		return memoryPoint{}, err
	}
	var m memoryPoint
	if m.Idle, err = procMemory(ks.pid, "VmRSS"); err != nil {
		return m, err
	}
	t := target{name: "kernel fs.read 1 KiB, " + name, url: ks.url + "/v1/syscalls", pid: ks.pid, want: []byte(`"status":"ok"`),
		body: func(w, _ int) []byte {
			b, _ := json.Marshal(map[string]any{
				"tool_id": "fs.read", "args": map[string]string{"path": "a.txt"}, "agent_id": tok.AgentID,
				"capability_token": tok.Token, "capability_token_id": tok.ID, "policy_hash": ph,
				"provenance": map[string]any{"session_id": fmt.Sprintf("bench-%d", w)},
			})
			return b
		}}
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
	w("`kernelctl serve` answering the audited fs.read of section 1–2 to %d concurrent clients (closed loop, a session each), once with serve's own GC target (GOGC unset; see serverGCPercent in cmd/kernelctl/serve.go) and once with Go's default (GOGC=100). Resident memory of the server process from /proc: before the load, the mean of samples every 50 ms during it, and the peak since start (VmHWM).", memoryClients)
	w("")
	w("| GC setting | calls/s | p99 µs | server CPU µs/call | RSS idle MiB | RSS mean MiB | RSS peak MiB |")
	w("|---|---:|---:|---:|---:|---:|---:|")
	for _, m := range r.Memory {
		name := "GOGC unset (serve's own)"
		if m.GOGC != "" {
			name = "GOGC=" + m.GOGC
		}
		w("| %s | %s | %s | %s | %s | %s | %s |", name, num(m.Load.Rate()), µs(m.Load.P99), µs(m.Load.ServerCPU), mib(m.Idle), mib(m.Mean), mib(m.Peak))
	}
	w("")
}
