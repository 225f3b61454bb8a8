package kernel

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/policy"
	"github.com/capkernel/capkernel/sandbox"
)

// TestSecretAgreesWithPolicy: the sandbox hides from a command exactly the
// path components the policy refuses every fs call on (sandbox.Secret, the
// Go twin of the rego rule secret_component), so what fs.read may not
// read, no command reads either.
func TestSecretAgreesWithPolicy(t *testing.T) {
	e, err := policy.Load(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	names := []string{
		".env", ".env.local", ".env.", ".envrc", ".ENV", "my.envelope", "environment.txt", "env",
		".ssh", ".aws", ".gnupg", ".ssh2", "ssh",
		"x.pem", ".pem", "cert.pem.md", "PEM", "x.PEM",
		"id_rsa", "id_rsa.pub", "id_rsa2", "id_dsa", "id_ecdsa", "id_ed25519", "id_ed25519_sk", "ID_RSA", "my_id_rsa",
		"notes.txt", ".git", "Makefile", "a b", "é.pem",
	}
	for _, name := range names {
		for _, path := range []string{name, "d/" + name, name + "/f"} {
			d, err := e.Decide(context.Background(), &policy.Input{ToolID: "fs.read", SideEffect: "READ", AgentID: "a",
				Resources: []policy.Resource{{Kind: "fs", Op: "read", Path: path, RealPath: path}}})
			if err != nil {
				t.Fatal(err)
			}
			refused := slices.ContainsFunc(d.RiskBasis, func(b string) bool { return strings.HasPrefix(b, "secret path: ") })
			if refused != sandbox.Secret(name) {
				t.Errorf("%q: the policy refuses it as a secret: %v; sandbox.Secret: %v", path, refused, sandbox.Secret(name))
			}
		}
	}
}
