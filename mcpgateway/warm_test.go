package mcpgateway

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/capkernel/capkernel/kernel"
)

type invokerFunc func(ctx context.Context, env []byte) (*kernel.Result, error)

func (f invokerFunc) Invoke(ctx context.Context, env []byte) (*kernel.Result, error) {
	return f(ctx, env)
}

// Calls on the warm invoker never wait for one another, return what the
// invoker returned, and a panic of the invoker is the caller's.
func TestWarmInvoker(t *testing.T) {
	const n = 8
	var mu sync.Mutex
	ran := map[string]bool{} // the goroutines the echo calls ran on
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	w := newWarmInvoker(invokerFunc(func(ctx context.Context, env []byte) (*kernel.Result, error) {
		switch string(env) {
		case "panic":
			panic("boom")
		case "fail":
			return nil, errors.New("no kernel")
		case "echo":
			mu.Lock()
			ran[goroutineID()] = true
			mu.Unlock()
		case "wait":
			// Answers only once all n calls are in flight at once.
			arrived.Done()
			select {
			case <-all:
			case <-time.After(10 * time.Second):
				return nil, errors.New("the calls were not all in flight at once")
			}
		}
		return &kernel.Result{ToolID: string(env)}, nil
	}))
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := w.Invoke(context.Background(), []byte("wait")); err != nil || r.ToolID != "wait" {
				t.Errorf("Invoke(wait) = %v, %v", r, err)
			}
		}()
	}
	wg.Wait()
	// Now n goroutines are idle: these calls reuse them, and none runs on
	// the caller's goroutine.
	for range 3 * n {
		if r, err := w.Invoke(context.Background(), []byte("echo")); err != nil || r.ToolID != "echo" {
			t.Fatalf("Invoke(echo) = %v, %v", r, err)
		}
	}
	if ran[goroutineID()] || len(ran) > n {
		t.Fatalf("%d sequential calls ran on %d goroutines (the caller's among them: %v), want at most the %d kept", 3*n, len(ran), ran[goroutineID()], n)
	}
	if _, err := w.Invoke(context.Background(), []byte("fail")); err == nil || err.Error() != "no kernel" {
		t.Fatalf("Invoke(fail): %v", err)
	}
	defer func() {
		if p := recover(); p != "boom" {
			t.Fatalf("Invoke(panic) raised %v, want boom", p)
		}
	}()
	w.Invoke(context.Background(), []byte("panic"))
	t.Fatal("Invoke(panic) returned")
}

// goroutineID is the id of the calling goroutine, from its stack trace's
// first line ("goroutine 42 [running]:").
func goroutineID() string {
	var b [64]byte
	f := strings.Fields(string(b[:runtime.Stack(b[:], false)]))
	return f[1]
}
