package captoken

import (
	"crypto/ed25519"
	"testing"
)

// BenchmarkVerify measures Verify of a valid token without a cache (every
// call parses and checks the signature) and with one (every call after the
// first is a cache hit).
func BenchmarkVerify(b *testing.B) {
	key := newKey(b)
	pub := key.Public().(ed25519.PublicKey)
	tok := mint(b, key, testClaims())
	for _, bc := range []struct {
		name      string
		cacheSize int
	}{{"cold", -1}, {"warm", 0}} {
		b.Run(bc.name, func(b *testing.B) {
			v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{KeyID(pub): pub}, Audience: "kernel-1", CacheSize: bc.cacheSize})
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Verify(tok, testBinding, t0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
