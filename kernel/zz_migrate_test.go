package kernel

import (
	"context"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestZZMigrate(t *testing.T) {
	dir := os.Getenv("MIG_DIR")
	if dir == "" {
		t.Skip()
	}
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM") {
			t.Log("before", l)
		}
	}
	var peak uint64
	stop := make(chan struct{})
	go func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak {
				peak = ms.HeapAlloc
			}
		}
	}()
	start := time.Now()
	k, err := Open(context.Background(), Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Log("open took", time.Since(start))
	close(stop)
	time.Sleep(20 * time.Millisecond)
	t.Log("peak heap", peak>>20, "MiB")
	b, _ = os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM") {
			t.Log("after", l)
		}
	}
	c, err := k.Inspector().Verify(nil)
	t.Log(c.Intact, c.Reason, err)
	k.Close()
}
