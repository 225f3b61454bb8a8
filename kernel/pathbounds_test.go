package kernel

import (
	"strings"
	"testing"

	"github.com/capkernel/capkernel/txn"
)

// TestOverlongPathRefusedBeforePolicy: a path over 4096 bytes or 255
// components, as an argument or an fs precondition ref, keyed or not, is
// refused invalid_args before the policy (each envelope names a stale
// policy hash, which step 6 would refuse) and so before any lock, with a
// message naming its size and the limit, not the path. One at the limits
// passes step 5. Before, such a path reached the lock plan, whose
// ancestor walk was quadratic in its length (a 256 KiB path: 28 s of CPU).
func TestOverlongPathRefusedBeforePolicy(t *testing.T) {
	h := newHarness(t)
	long := strings.Repeat("a/", 2048) + "x"                                                   // 4097 bytes
	deep := strings.Repeat("a/", 255) + "x"                                                    // 256 components
	atLimits := strings.Repeat("b"+strings.Repeat("c", 30)+"/", 127) + strings.Repeat("d", 32) // 4096 bytes, 128 components
	atDepth := strings.Repeat("e/", 254) + "x"                                                 // 255 components
	ref := func(p string) func(*Envelope) {
		return func(e *Envelope) { e.PreconditionRefs = []txn.Precondition{{Ref: "fs:" + p, Absent: true}} }
	}
	cases := []struct {
		name, tool string
		path       string // the path argument
		mods       []func(*Envelope)
		class      string
		want       []string // in the message
	}{
		{"fs.read of 4097 bytes", "fs.read", long, nil, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"keyed fs.read of 4097 bytes", "fs.read", long, []func(*Envelope){key("long-read")}, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"fs.write of 256 components", "fs.write", deep, []func(*Envelope){key("deep-write")}, ErrInvalidArgs, []string{"256 components", "limit of 255 components"}},
		{"absolute fs.write of 4097 bytes", "fs.write", h.ws + "/" + long[len(h.ws)+1:], []func(*Envelope){key("abs-write")}, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"fs ref of 4097 bytes", "fs.read", "f.txt", []func(*Envelope){ref(long)}, ErrInvalidArgs, []string{"4097 bytes", "limit of 4096 bytes"}},
		{"keyed fs ref of 256 components", "fs.read", "f.txt", []func(*Envelope){key("deep-ref"), ref(deep)}, ErrInvalidArgs, []string{"256 components", "limit of 255 components"}},
		{"4096 bytes, absent", "fs.read", atLimits, []func(*Envelope){ref(atLimits)}, ErrPolicyMismatch, nil},
		{"255 components, absent", "fs.write", atDepth, []func(*Envelope){key("at-depth"), ref(atDepth)}, ErrPolicyMismatch, nil},
	}
	if len(long) != 4097 || len(atLimits) != 4096 {
		t.Fatalf("test paths of %d and %d bytes", len(long), len(atLimits))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := map[string]any{"path": tc.path}
			if tc.tool == "fs.write" {
				args["content"] = "x"
			}
			mods := append(tc.mods, func(e *Envelope) { e.PolicyHash = "blake3:" + strings.Repeat("0", 64) })
			r := h.invoke(tc.tool, args, mods...)
			if errClass(r) != tc.class {
				t.Fatalf("%s %+v, want %s", errClass(r), r.Error, tc.class)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Error.Message, w) {
					t.Errorf("message %q does not say %q", r.Error.Message, w)
				}
			}
			if tc.want != nil && (len(r.Error.Message) > 200 || strings.Contains(r.Error.Message, "a/a/a/")) {
				t.Errorf("message of %d bytes holds the path: %.100q", len(r.Error.Message), r.Error.Message)
			}
		})
	}
}
