package kernel

import (
	"testing"
	"time"

	"github.com/capkernel/capkernel/syscalls"
)

// The execution bound of a syscall that sets none: the class's override,
// else CallTimeout, else 60 s, or 600 s for EXECUTE and NETWORK.
func TestTimeoutByClass(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		se   syscalls.SideEffect
		want time.Duration
	}{
		{"read default", Config{}, syscalls.Read, 60 * time.Second},
		{"write default", Config{}, syscalls.Write, 60 * time.Second},
		{"execute default", Config{}, syscalls.Execute, 600 * time.Second},
		{"network default", Config{}, syscalls.Network, 600 * time.Second},
		{"CallTimeout for every class", Config{CallTimeout: 5 * time.Second}, syscalls.Execute, 5 * time.Second},
		{"class override wins", Config{CallTimeout: 5 * time.Second, Timeouts: map[syscalls.SideEffect]time.Duration{syscalls.Execute: time.Hour}}, syscalls.Execute, time.Hour},
		{"override of another class", Config{Timeouts: map[syscalls.SideEffect]time.Duration{syscalls.Execute: time.Hour}}, syscalls.Read, 60 * time.Second},
	}
	for _, tc := range tests {
		if got := tc.cfg.timeout(tc.se); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
}
