package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// A result is one line of `go test -bench` output: the benchmark's name
// without its -GOMAXPROCS suffix and each metric by unit ("ns/op",
// "calls/s", …).
type result struct {
	Name    string
	Metrics map[string]float64
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// parseBench reads the benchmark lines of `go test -bench` output; other
// lines are ignored.
func parseBench(out []byte) []result {
	var rs []result
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		r := result{Name: procsSuffix.ReplaceAllString(f[0], ""), Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			r.Metrics[f[i+1]] = v
		}
		rs = append(rs, r)
	}
	return rs
}

// goBench runs the benchmarks matching pattern in pkg and returns their
// results; env adds variables to the go command's environment.
func goBench(pkg, pattern, benchtime string, env ...string) ([]result, error) {
	cmd := exec.Command("go", "test", "-run=^$", "-bench="+pattern, "-benchtime="+benchtime, "-benchmem", "-timeout=15m", pkg)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go test -bench=%s %s: %w\n%s", pattern, pkg, err, out)
	}
	rs := parseBench(out)
	if len(rs) == 0 {
		return nil, fmt.Errorf("go test -bench=%s %s: no benchmark ran\n%s", pattern, pkg, out)
	}
	return rs, nil
}

// find returns the metric unit of the result named name, or an error
// naming what is missing.
func find(rs []result, name, unit string) (float64, error) {
	for _, r := range rs {
		if r.Name == name {
			if v, ok := r.Metrics[unit]; ok {
				return v, nil
			}
			return 0, fmt.Errorf("benchmark %s reported no %s", name, unit)
		}
	}
	return 0, fmt.Errorf("no benchmark %s in the results", name)
}
