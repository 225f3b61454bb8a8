package b3

import (
	"bytes"
	"testing"

	"github.com/zeebo/blake3"
)

// TestPrefix: the hash a Prefix finishes is zeebo/blake3's keyed hash of
// prefix || tail, for every length up to five chunks and split points at
// and around every block boundary, the state reused for two tails; and
// an input past what a Prefix holds is refused, never hashed wrong.
func TestPrefix(t *testing.T) {
	in, raw := randomInput(3, 40*chunkLen)
	key := KeyOf(&raw)
	want := func(b []byte) []byte {
		z, err := blake3.NewKeyed(raw[:])
		if err != nil {
			t.Fatal(err)
		}
		z.Write(b)
		return z.Sum(nil)
	}
	for n := 0; n <= 5*chunkLen+blockLen; n++ {
		for _, at := range []int{0, n / 3, n - n%blockLen, n - n%blockLen - 1, n - 1, n} {
			if at < 0 || at > n {
				continue
			}
			p := NewPrefix(&key)
			if !p.Write(in[:at]) {
				t.Fatalf("Write of %d bytes refused", at)
			}
			for _, m := range []int{n, n - at/2} { // two tails on one state
				if m < at {
					continue
				}
				got, ok := p.Sum(in[at:m])
				if !ok || !bytes.Equal(got[:], want(in[:m])) {
					t.Fatalf("prefix %d, input %d bytes: %x (ok %v), zeebo/blake3 %x", at, m, got, ok, want(in[:m]))
				}
			}
		}
	}
	// PrefixMaxLen is the longest input a Prefix holds.
	for _, tc := range []struct {
		n  int
		ok bool
	}{{PrefixMaxLen - 1, true}, {PrefixMaxLen, true}, {PrefixMaxLen + 1, false}, {40 * chunkLen, false}} {
		p := NewPrefix(&key)
		got, ok := p.Sum(in[:tc.n])
		if ok != tc.ok || ok && !bytes.Equal(got[:], want(in[:tc.n])) {
			t.Errorf("%d bytes: ok %v (want %v), %x against %x", tc.n, ok, tc.ok, got, want(in[:tc.n]))
		}
		if p.Write(in[:tc.n]) != tc.ok {
			t.Errorf("Write of %d bytes reported %v, want %v", tc.n, !tc.ok, tc.ok)
		}
	}
}

func TestPrefixNoAllocs(t *testing.T) {
	var key Key
	in := make([]byte, 1500)
	p := NewPrefix(&key)
	p.Write(in[:1300])
	if n := testing.AllocsPerRun(100, func() { p.Sum(in[1300:]) }); n != 0 {
		t.Errorf("Sum allocates %v times", n)
	}
}
