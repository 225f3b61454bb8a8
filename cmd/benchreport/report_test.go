package main

import (
	"bytes"
	"encoding/xml"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseBench(t *testing.T) {
	out := []byte(`goos: linux
BenchmarkInvoke/echo/p=32-2         	    4000	    219050 ns/op	      4565 calls/s	   54241 B/op	     398 allocs/op
BenchmarkLedger1M/InclusionProof-2  	       1	    177359 ns/op	       640.0 max-proof-bytes
--- FAIL: BenchmarkX
BenchmarkBroken-2 notanumber 1 ns/op
PASS
`)
	rs := parseBench(out)
	if len(rs) != 2 {
		t.Fatalf("parsed %d results, want 2: %+v", len(rs), rs)
	}
	cases := []struct {
		name, unit string
		want       float64
	}{
		{"BenchmarkInvoke/echo/p=32", "calls/s", 4565},
		{"BenchmarkInvoke/echo/p=32", "allocs/op", 398},
		{"BenchmarkLedger1M/InclusionProof", "max-proof-bytes", 640},
	}
	for _, c := range cases {
		got, err := find(rs, c.name, c.unit)
		if err != nil || got != c.want {
			t.Errorf("%s %s = %v, %v; want %v", c.name, c.unit, got, err, c.want)
		}
	}
	if _, err := find(rs, "BenchmarkInvoke/echo/p=32", "entries/s"); err == nil {
		t.Error("a unit the benchmark did not report was found")
	}
}

func TestNum(t *testing.T) {
	for v, want := range map[float64]string{1234567: "1,234,567", 999: "999", 12.34: "12.3", 0.5: "0.50", 100000: "100,000", 0: "0"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]float64{0: 1, 3: 5, 4327: 5000, 1e4: 1e4, 0.03: 0.05, 101: 200} {
		if got := niceCeil(v); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", v, got, want)
		}
	}
}

// The report and chart are written from a run's figures; the chart must be
// well-formed XML whatever the machine's CPU name holds.
func TestReportAndChart(t *testing.T) {
	r := &report{Began: time.Unix(0, 0), CPU: `Weird <CPU> & "Co"`, CPUs: 2, GoVersion: "go1.26", OPAVersion: "v1.22.2", FloorAnswer: 3844, LastAnswer: 4768}
	for _, c := range concurrencies {
		for i, name := range []string{kernelEcho, kernelRead, kernelEchoEval, opaServer, floorTarget} {
			r.HTTP = append(r.HTTP, point{Target: name, Concurrency: c, Calls: 1000 * c * (i + 1), Seconds: 1, P50: time.Millisecond, P99: time.Duration(c) * time.Millisecond, ServerCPU: 300 * time.Microsecond})
		}
	}
	r.Go = parseBench([]byte("BenchmarkInvoke/fs.read-1KiB/p=64-2 10 1 ns/op 21000 calls/s\n" +
		"BenchmarkInvoke/fs.read-1KiB/p=256-2 10 1 ns/op 20000 calls/s\n" +
		"BenchmarkAuditStorage/fs.read/full-2 3000 1 ns/op 4480 db-bytes/call 4478 live-bytes/call\n"))
	md := string(r.markdown())
	for _, want := range []string{"| in-process audited fs.read 1 KiB ≥ 20,000/s (best concurrency) | 21,000 calls/s (p=64) | yes |",
		"| in-process audited echo ≥ 25,000/s (best concurrency) | not measured | n/a |",
		"| HTTP fs.read at c=32 ≥ 1.5× OPA's server deciding the same input | 0.50× | no |",
		"| 32 | 0.25× | 0.50× | 0.75× | 1.00× | 1.25× | 0.40× |",
		"(3,844 bytes, the run's first; the kernel's last was 4,768,",
		"| kernel.db per audited fs.read 1 KiB, payloads kept ≤ 2 KB (issue 19) | 4,480 B | no |",
		"| fs.read | full | 4,480 | 4,478 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	d := xml.NewDecoder(bytes.NewReader(r.chart()))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("chart is not well-formed XML: %v", err)
		}
	}
}

func TestProcCPU(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; {
	}
	after, err := procCPU(os.Getpid())
	if err != nil || after < before {
		t.Fatalf("procCPU: %v then %v (%v)", before, after, err)
	}
	if _, err := procCPU(-1); err == nil {
		t.Fatal("procCPU of no process succeeded")
	}
}

func TestProcMemory(t *testing.T) {
	rss, err := procMemory(os.Getpid(), "VmRSS")
	if err != nil || rss < 1<<20 {
		t.Fatalf("procMemory VmRSS = %d, %v; want at least 1 MiB", rss, err)
	}
	peak, err := procMemory(os.Getpid(), "VmHWM")
	if err != nil || peak < rss {
		t.Fatalf("procMemory VmHWM = %d (VmRSS %d), %v", peak, rss, err)
	}
	if _, err := procMemory(os.Getpid(), "NoSuchField"); err == nil {
		t.Fatal("procMemory of a missing field succeeded")
	}
}
