package receipts

import (
	"os"
	"strings"
	"testing"
)

// FuzzVerify checks that Verify never panics and accepts nothing but what
// the Signer writes: an accepted JWS re-signs to exactly itself.
func FuzzVerify(f *testing.F) {
	golden, err := os.ReadFile("testdata/receipt.jws")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(strings.TrimSpace(string(golden)))
	f.Add("e30.e30.")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	key := testKey(f)
	s := NewSigner(key)
	set := jwksOf(f, key)
	f.Fuzz(func(t *testing.T, jws string) {
		r, err := Verify(jws, set)
		if err != nil {
			return
		}
		again, err := s.Sign(r)
		if err != nil {
			t.Fatal(err)
		}
		if again != jws {
			t.Errorf("Verify accepted %q, which the Signer writes as %q", jws, again)
		}
	})
}
