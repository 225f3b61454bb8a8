package captoken

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.jwt")

// goldenKey returns the issuer key of the golden vector, made from the
// seed in testdata/issuer.seed: the key of RFC 8032 §7.1 test 1, which is
// also the key of the RFC 8037 Appendix A examples.
func goldenKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "issuer.seed"))
	if err != nil {
		t.Fatal(err)
	}
	seed, err := hex.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		t.Fatalf("testdata/issuer.seed is not %d hex-encoded bytes: %v", ed25519.SeedSize, err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

// TestKeyID checks KeyID against the RFC 8037 Appendix A.3 thumbprint.
func TestKeyID(t *testing.T) {
	pub := goldenKey(t).Public().(ed25519.PublicKey)
	if got, want := KeyID(pub), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"; got != want {
		t.Fatalf("KeyID = %s, want %s", got, want)
	}
	if got := KeyID(pub[:31]); got != "" {
		t.Fatalf("KeyID of a 31-byte key = %q, want \"\"", got)
	}
}

// TestGolden pins the token format: fixed claims and key give exactly the
// token in testdata/golden.jwt, and that token verifies to those claims.
func TestGolden(t *testing.T) {
	key := goldenKey(t)
	c := Claims{
		Issuer:    "capkernel-test-issuer",
		Subject:   "agent-7",
		Audience:  "kernel-test",
		ID:        "0190b6a0-0000-7000-8000-000000000001",
		IssuedAt:  time.Unix(1767225600, 0),
		NotBefore: time.Unix(1767225600, 0),
		Expiry:    time.Unix(1767229200, 0),
		Cap: Capability{
			Tools: []string{"echo", "fs.*"},
			FS:    []FSRoot{{Path: "/srv/work", Mode: "rw"}, {Path: "/etc/ssl", Mode: "r"}},
			Net:   []string{"api.example.com:443", "*.example.org"},
			Budgets: map[string]int64{
				BudgetCalls: 100, BudgetCPUMillis: 60000, BudgetDiskWriteBytes: 1 << 20, BudgetNetBytes: 1 << 24,
			},
			Autonomy: "soft_gate",
			Parent:   "0190b6a0-0000-7000-8000-000000000000",
		},
	}
	tok, err := Mint(key, c)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "golden.jwt")
	if *update {
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := string(bytes.TrimSpace(b))
	if tok != want {
		t.Fatalf("Mint = \n%s\nwant (testdata/golden.jwt)\n%s", tok, want)
	}

	v := NewVerifier(VerifierConfig{
		Keys:     map[string]ed25519.PublicKey{KeyID(key.Public().(ed25519.PublicKey)): key.Public().(ed25519.PublicKey)},
		Issuer:   "capkernel-test-issuer",
		Audience: "kernel-test",
	})
	got, err := v.Verify(want, Binding{TokenID: c.ID, AgentID: c.Subject}, time.Unix(1767225600, 0))
	if err != nil {
		t.Fatal(err)
	}
	if !claimsEqual(got.Claims, c) {
		t.Fatalf("golden token verifies to\n%+v\nwant\n%+v", got.Claims, c)
	}
}
