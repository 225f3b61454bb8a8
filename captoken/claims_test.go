package captoken

import (
	"crypto/ed25519"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestClaimsValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(c *Claims)
		want string // substring of the error; "" for valid
	}{
		{"valid", func(c *Claims) {}, ""},
		{"no issuer", func(c *Claims) { c.Issuer = "" }, ""},
		{"autonomy empty", func(c *Claims) { c.Cap.Autonomy = "" }, ""},
		{"every autonomy", func(c *Claims) { c.Cap.Autonomy = "no_go" }, ""},
		{"every budget, zero allowed", func(c *Claims) {
			c.Cap.Budgets = map[string]int64{BudgetCalls: 0, BudgetCPUMillis: 1, BudgetDiskWriteBytes: 2, BudgetNetBytes: 3}
		}, ""},
		{"fs root /", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/", Mode: "r"}} }, ""},
		{"exp a second after nbf", func(c *Claims) { c.Expiry = c.NotBefore.Add(time.Second) }, ""},
		{"nbf before iat", func(c *Claims) { c.NotBefore = c.IssuedAt.Add(-time.Minute) }, ""},

		{"empty sub", func(c *Claims) { c.Subject = "" }, "sub is empty"},
		{"empty aud", func(c *Claims) { c.Audience = "" }, "aud is empty"},
		{"empty jti", func(c *Claims) { c.ID = "" }, "jti is empty"},
		{"no iat", func(c *Claims) { c.IssuedAt = time.Time{} }, "iat is not set"},
		{"no nbf", func(c *Claims) { c.NotBefore = time.Time{} }, "nbf is not set"},
		{"no exp", func(c *Claims) { c.Expiry = time.Time{} }, "exp is not set"},
		{"exp before nbf", func(c *Claims) { c.Expiry = c.NotBefore.Add(-time.Second) }, "is not after nbf"},
		{"exp within the second of nbf", func(c *Claims) { c.Expiry = c.NotBefore.Add(999 * time.Millisecond) }, "is not after nbf"},
		{"no tools", func(c *Claims) { c.Cap.Tools = nil }, "names no tool"},
		{"empty tool pattern", func(c *Claims) { c.Cap.Tools = []string{"echo", ""} }, "cap.tools[1]"},
		{"bad tool pattern", func(c *Claims) { c.Cap.Tools = []string{"fs.?"} }, "wildcard"},
		{"relative fs root", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "srv/work", Mode: "r"}} }, "not an absolute, clean path"},
		{"unclean fs root", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/../etc", Mode: "r"}} }, "not an absolute, clean path"},
		{"trailing slash fs root", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/", Mode: "r"}} }, "not an absolute, clean path"},
		{"empty fs root", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "", Mode: "r"}} }, "not an absolute, clean path"},
		{"fs mode w", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv", Mode: "w"}} }, `mode "w" is not r or rw`},
		{"fs mode empty", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv"}} }, `mode "" is not r or rw`},
		{"bad net pattern", func(c *Claims) { c.Cap.Net = []string{"api.example.com:http"} }, "cap.net[0]"},
		{"unknown budget", func(c *Claims) { c.Cap.Budgets = map[string]int64{"tokens": 5} }, `unknown key "tokens"`},
		{"negative budget", func(c *Claims) { c.Cap.Budgets = map[string]int64{BudgetNetBytes: -1} }, "is negative"},
		{"an ancestor's fs roots", func(c *Claims) {
			c.Cap.Parent = "p"
			c.Cap.Ancestors = []Ancestor{{ID: "p", FS: []FSRoot{{Path: "/srv", Mode: "rw"}, {Path: "/srv/ro", Mode: "r"}}}}
		}, ""},
		{"an ancestor's relative fs root", func(c *Claims) {
			c.Cap.Parent = "p"
			c.Cap.Ancestors = []Ancestor{{ID: "p", FS: []FSRoot{{Path: "srv/ro", Mode: "r"}}}}
		}, `cap.ancestors[0].fs[0].path "srv/ro" is not an absolute, clean path`},
		{"an ancestor's unclean fs root", func(c *Claims) {
			c.Cap.Parent = "p"
			c.Cap.Ancestors = []Ancestor{{ID: "p", FS: []FSRoot{{Path: "/srv", Mode: "rw"}, {Path: "/srv/ro/", Mode: "r"}}}}
		}, `cap.ancestors[0].fs[1].path "/srv/ro/" is not an absolute, clean path`},
		{"an ancestor's fs mode w", func(c *Claims) {
			c.Cap.Parent = "p"
			c.Cap.Ancestors = []Ancestor{{ID: "p", FS: []FSRoot{{Path: "/srv", Mode: "w"}}}}
		}, `cap.ancestors[0].fs[0].mode "w" is not r or rw`},
		{"an ancestor's fs root with a base", func(c *Claims) {
			c.Cap.Parent = "p"
			c.Cap.Ancestors = []Ancestor{{ID: "p", FS: []FSRoot{{Path: "/srv/ro", Mode: "r", Base: "/srv"}}}}
		}, "cap.ancestors[0].fs[0] has a base"},
		{"unknown autonomy", func(c *Claims) { c.Cap.Autonomy = "Autopilot" }, `cap.autonomy "Autopilot"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testClaims()
			tt.edit(&c)
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate: %v, want error containing %q", err, tt.want)
			}
			// Mint must refuse exactly what Validate refuses.
			_, err = Mint(newKey(t), c)
			if (err == nil) != (tt.want == "") {
				t.Fatalf("Mint error = %v, Validate wants %q", err, tt.want)
			}
		})
	}
}

// TestMintRoundTrip checks that Verify returns the claims Mint was given,
// with times cut to whole seconds in UTC.
func TestMintRoundTrip(t *testing.T) {
	key := newKey(t)
	c := testClaims()
	local := time.FixedZone("UTC+2", 2*3600)
	c.IssuedAt = t0.Add(400 * time.Millisecond).In(local)
	c.NotBefore = t0.Add(900 * time.Millisecond).In(local)
	c.Cap.Parent = "tok-0"
	tok := mint(t, key, c)
	v := NewVerifier(VerifierConfig{Keys: map[string]ed25519.PublicKey{KeyID(key.Public().(ed25519.PublicKey)): key.Public().(ed25519.PublicKey)}, Audience: "kernel-1"})
	got, err := v.Verify(tok, testBinding, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	want := testClaims()
	want.Cap.Parent = "tok-0"
	if !claimsEqual(got.Claims, want) {
		t.Fatalf("Verify returned claims\n%+v\nwant\n%+v", got.Claims, want)
	}
	if got.Claims.IssuedAt.Location() != time.UTC {
		t.Fatalf("times are in %v, want UTC", got.Claims.IssuedAt.Location())
	}
}

func claimsEqual(a, b Claims) bool {
	x, err1 := marshalClaims(a)
	y, err2 := marshalClaims(b)
	return err1 == nil && err2 == nil && string(x) == string(y) && a.IssuedAt.Equal(b.IssuedAt)
}

func TestMintBadKey(t *testing.T) {
	for _, key := range []ed25519.PrivateKey{nil, make(ed25519.PrivateKey, 32)} {
		if _, err := Mint(key, testClaims()); err == nil || !strings.Contains(err.Error(), "private key is") {
			t.Errorf("Mint with a %d-byte key: error %v, want one naming the key size", len(key), err)
		}
	}
}

func TestMintOversize(t *testing.T) {
	c := testClaims()
	c.Subject = strings.Repeat("a", MaxTokenSize)
	if _, err := Mint(newKey(t), c); err == nil || !strings.Contains(err.Error(), "over the 16384-byte limit") {
		t.Fatalf("Mint of an oversize token: error %v, want the size limit", err)
	}
}

// TestMintFSRoots checks that Mint refuses a path named in two roots,
// whatever their modes, and more than MaxFSRoots roots, and signs up to
// MaxFSRoots distinct ones.
func TestMintFSRoots(t *testing.T) {
	roots := func(n int) []FSRoot {
		out := make([]FSRoot, n)
		for i := range out {
			out[i] = FSRoot{Path: fmt.Sprintf("/w/d%d", i), Mode: "r"}
		}
		return out
	}
	for _, tc := range []struct {
		name string
		fs   []FSRoot
		want string // "" for a token
	}{
		{"distinct, nested", []FSRoot{{Path: "/w", Mode: "rw"}, {Path: "/w/ro", Mode: "r"}}, ""},
		{"at the limit", roots(MaxFSRoots), ""},
		{"over the limit", roots(MaxFSRoots + 1), fmt.Sprintf("cap.fs holds %d roots; the limit is %d", MaxFSRoots+1, MaxFSRoots)},
		{"a path twice, one mode", []FSRoot{{Path: "/w", Mode: "r"}, {Path: "/w", Mode: "r"}}, "cap.fs[1] names /w, as cap.fs[0] does"},
		{"a path twice, two modes", []FSRoot{{Path: "/w", Mode: "rw"}, {Path: "/v", Mode: "r"}, {Path: "/w", Mode: "r"}}, "cap.fs[2] names /w, as cap.fs[0] does"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testClaims()
			c.Cap.FS = tc.fs
			_, err := Mint(newKey(t), c)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Mint: %v; want a token", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Mint: %v; want an error saying %q", err, tc.want)
			}
		})
	}
}
