package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
	"github.com/capkernel/capkernel/telemetry"
)

// JSON kernelctl prints escapes what a terminal acts on as JSON does, so
// it reads back as the same value.
func TestJSONSafe(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"a":"b"}` + "\n", `{"a":"b"}` + "\n"},
		{`{"a":"x` + "\u009b2J\u202eKO\u202c\x7f" + `"}`, `{"a":"x\u009b2J\u202eKO\u202c\u007f"}`},
		{`"naïve ✓"`, `"naïve ✓"`},
	} {
		var b bytes.Buffer
		n, err := jsonSafe{&b}.Write([]byte(c.in))
		if err != nil || n != len(c.in) || b.String() != c.want {
			t.Errorf("%q: wrote %q (%d, %v), want %q", c.in, b.String(), n, err, c.want)
		}
		var in, out any
		if json.Unmarshal([]byte(c.in), &in) == nil && (json.Unmarshal(b.Bytes(), &out) != nil || !equalJSON(in, out)) {
			t.Errorf("%q: read back as %v, want %v", c.in, out, in)
		}
	}
}

// serve's log lines quote agents' text: in either format they reach the
// terminal escaped, and a JSON line stays JSON with the same values.
func TestServeLogTerminalSafe(t *testing.T) {
	const agent = "a\u009b2J\u202e\x7f\x1b[8m"
	for _, format := range []string{"json", "text"} {
		var b bytes.Buffer
		log, err := telemetry.NewLogger(jsonSafe{&b}, format, slog.LevelInfo)
		if err != nil {
			t.Fatal(err)
		}
		log.Info("call failed", slog.String("agent_id", agent))
		if strings.ContainsAny(b.String(), "\u009b\u202e\x7f\x1b") {
			t.Errorf("%s: logged %q", format, b.String())
		}
		var r struct {
			AgentID string `json:"agent_id"`
		}
		if format == "json" && (json.Unmarshal(b.Bytes(), &r) != nil || r.AgentID != agent) {
			t.Errorf("json: logged %q, want a JSON line with agent_id %q", b.String(), agent)
		}
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// A kernel kernelctl does not trust answers with an error message holding
// lines of a verdict and terminal escapes: kernelctl prints its one error
// line, escaped and quoted (review rev2-fronts F4: "signature: ok" lines
// printed under an erased refusal, and ESC [ 8 m hid what followed).
func TestErrorLineTerminalSafe(t *testing.T) {
	const message = "no such receipt\x1b[2K\r\nreceipt r5-aaaa\nsignature:    ok\nledger match: ok\ninclusion:    ok\x1b[8m\u202e"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"class": "invalid_args", "message": message}})
	}))
	defer srv.Close()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := receipts.JWKS(pub)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	jwksFile, admin := filepath.Join(dir, "jwks.json"), filepath.Join(dir, "admin")
	if err := os.WriteFile(jwksFile, jwks, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(admin, []byte("ckadmin_0123456789abcdef0123456789abcdef"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"receipts", "verify", "r5-0123456789abcdef", "--server", srv.URL, "--jwks", jwksFile, "--admin-token", admin},
		{"ledger", "prove", "--seq", "0", "--server", srv.URL, "--pubkey", jwksFile},
	} {
		out, stderr, code := run(t, args...)
		if code != 1 || out != "" {
			t.Fatalf("%v: exit %d, stdout %q, want 1 and none", args, code, out)
		}
		if strings.Count(stderr, "\n") != 1 || strings.ContainsAny(stderr, "\x1b\r\u202e") || !strings.Contains(stderr, `signature:    ok\nledger match`) {
			t.Errorf("%v: stderr %q, want one line with the message escaped", args, stderr)
		}
	}
}

// ledger prove prints the checkpoint's origin, which the kernel signed,
// escaped: it may hold C1 and bidirectional controls (review rev2-fronts
// F4: U+009B 2J cleared the screen on terminals that honour C1); with
// --json as a JSON escape, which reads back as the same origin.
func TestProofOriginTerminalSafe(t *testing.T) {
	const origin = "ck-1\u009b2J\u202eKO\u202c"
	pub, signer, vkey := checkpointKey(t, origin)
	var leaf [32]byte
	rand.Read(leaf[:])
	n, err := ledger.SignCheckpoint(signer, ledger.Checkpoint{Origin: origin, Size: 1, Root: leaf})
	if err != nil {
		t.Fatal(err)
	}
	cp := kernel.SignedCheckpoint{Origin: origin, Size: 1, Root: digest.Format(leaf), Note: string(n), VerifierKey: vkey}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v any
		switch r.URL.Path {
		case "/v1/ledger/checkpoint":
			v = cp
		case "/v1/ledger/proof/inclusion":
			v = kernel.InclusionResponse{Inclusion: ledger.Inclusion{LeafIndex: 0, TreeSize: 1, LeafHash: digest.Format(leaf), Proof: []string{}}, Root: digest.Format(leaf)}
		default:
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(v)
	}))
	defer srv.Close()
	jwks, err := receipts.JWKS(pub)
	if err != nil {
		t.Fatal(err)
	}
	pk := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(pk, jwks, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ledger", "prove", "--seq", "0"}, `checkpoint of ck-1\u009b2J\u202eKO\u202c, size 1`},
		{[]string{"ledger", "checkpoint", "--state", ""}, `origin      ck-1\u009b2J\u202eKO\u202c` + "\n"},
	} {
		out := mustRun(t, append(c.args, "--server", srv.URL, "--pubkey", pk)...)
		if strings.ContainsAny(out, "\u009b\u202e\u202c") || !strings.Contains(out, c.want) {
			t.Errorf("%v printed %q, want the origin escaped", c.args, out)
		}
	}
	out := mustRun(t, "ledger", "checkpoint", "--state", "", "--server", srv.URL, "--pubkey", pk, "--json")
	var got kernel.SignedCheckpoint
	if strings.ContainsAny(out, "\u009b\u202e\u202c") || json.Unmarshal([]byte(out), &got) != nil || got.Origin != origin {
		t.Errorf("ledger checkpoint --json printed %q, want the origin escaped as JSON", out)
	}
}
