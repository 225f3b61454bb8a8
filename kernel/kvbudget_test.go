package kernel

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/captoken"
)

// TestKVPutChargesDiskWriteBytes: a kv.put's value is charged to
// disk_write_bytes (its JSON bytes: a string counts with its quotes; the
// key is free), and a put past what is left is refused budget_exceeded,
// rolled back, its value not stored, as an fs.write is. Found by review:
// five puts of 900 KiB each committed under disk_write_bytes=10, the
// kernel's database filling for free.
func TestKVPutChargesDiskWriteBytes(t *testing.T) {
	h := newHarness(t)
	tok, jti := h.mint(h.agent, captoken.Capability{Tools: []string{"*"}, KV: []captoken.KVScope{{Keys: "*", Mode: "rw"}},
		FS: []captoken.FSRoot{{Path: h.ws, Mode: "rw"}}, Budgets: map[string]int64{"disk_write_bytes": 10}})
	use := func(e *Envelope) { e.CapabilityToken, e.CapabilityTokenID = tok, jti }
	steps := []struct {
		tool  string
		args  map[string]any
		class string
	}{
		{"kv.put", map[string]any{"key": "blob", "value": strings.Repeat("x", 900<<10)}, ErrBudgetExceeded},
		{"kv.put", map[string]any{"key": strings.Repeat("k", 200), "value": "abcdef"}, ""}, // 8 bytes
		{"kv.put", map[string]any{"key": "n", "value": 123}, ErrBudgetExceeded},            // 3 more: 11
		{"kv.put", map[string]any{"key": "n", "value": 12}, ""},                            // 10: the limit
		{"fs.write", map[string]any{"path": "f", "content": "y"}, ErrBudgetExceeded},
	}
	for i, s := range steps {
		r := h.invoke(s.tool, s.args, key(fmt.Sprint("k", i)), use)
		if errClass(r) != s.class {
			t.Fatalf("step %d %s: %q %+v, want %q", i, s.tool, errClass(r), r.Error, s.class)
		}
		if s.class != "" && r.TxOutcome != RolledBack {
			t.Fatalf("step %d %s: refused %s, want rolled_back", i, s.tool, r.TxOutcome)
		}
	}
	if r := h.invoke("kv.get", map[string]any{"key": "blob"}); errClass(r) != "" || !strings.Contains(string(r.Result), `"found":false`) {
		t.Fatalf("kv.get of the refused put's key: %q %s, want not found", errClass(r), r.Result)
	}
	h.tokensBeforeAndAfterRestart(t, func(when string, infos []TokenInfo) {
		i := slices.IndexFunc(infos, func(ti TokenInfo) bool { return ti.ID == jti })
		if i < 0 || infos[i].Used["disk_write_bytes"] != 10 {
			t.Fatalf("%s: token %s: %+v, want 10 disk_write_bytes used", when, jti, infos)
		}
	})
}
