package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// ledger checkpoint remembers checkpoints per signing key as well as per
// origin: real kernels d1, d2 (initialized, then given d1's key, so its
// checkpoints carry another origin under the same key) and d3 (its own
// key). A key's checkpoint under another origin, or one that does not
// extend what the key signed, exits 1; state from before per-key records
// (per origin only) is migrated and keeps working.
func TestCheckpointRememberedPerKey(t *testing.T) {
	dir := t.TempDir()
	data := func(name string) string { return filepath.Join(dir, name) }
	for _, d := range []string{"d1", "d2", "d3"} {
		mustRun(t, "init", "--data", data(d))
	}
	for _, f := range []string{kernel.ReceiptKeyFile, kernel.ReceiptPublicKeyFile} {
		b, err := os.ReadFile(filepath.Join(data("d1"), f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data("d2"), f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	url := map[string]string{}
	for _, d := range []string{"d1", "d2", "d3"} {
		url[d] = startServer(t, data(d)).url
	}
	pub1, err := loadPublicKey(filepath.Join(data("d1"), kernel.ReceiptPublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	// checkpoint runs ledger checkpoint against server d with state, the
	// key pinned to d's own (d2's is d1's).
	checkpoint := func(d, state string, extra ...string) (string, int) {
		out, stderr, code := run(t, append([]string{"ledger", "checkpoint", "--server", url[d], "--state", state,
			"--pubkey", filepath.Join(data(d), kernel.ReceiptPublicKeyFile)}, extra...)...)
		return out + stderr, code
	}
	latest := map[string]kernel.SignedCheckpoint{}
	for _, d := range []string{"d1", "d2"} {
		out, code := checkpoint(d, "", "--json")
		var sc kernel.SignedCheckpoint
		if err := json.Unmarshal([]byte(out), &sc); code != 0 || err != nil {
			t.Fatalf("%s: exit %d %v:\n%s", d, code, err, out)
		}
		latest[d] = sc
	}
	if latest["d1"].Origin == latest["d2"].Origin {
		t.Fatalf("d1 and d2 share the origin %q", latest["d1"].Origin)
	}
	// The state file of a key is named after the kid the kernel's JWKS gives it.
	if jwks := mustRun(t, "receipts", "jwks", "--server", url["d1"]); !strings.Contains(jwks, `"kid":"`+keyFingerprint(pub1)+`"`) {
		t.Fatalf("kid %s not in the JWKS %s", keyFingerprint(pub1), jwks)
	}
	keyFile := func(state string) string { return filepath.Join(state, "keys", keyFingerprint(pub1)+".json") }
	// seen remembers d1's checkpoint in a new state dir.
	seen := func(t *testing.T) string {
		state := t.TempDir()
		if out, code := checkpoint("d1", state); code != 0 {
			t.Fatalf("d1: exit %d:\n%s", code, out)
		}
		return state
	}
	// perOriginOnly is seen as kernelctl wrote it before per-key records.
	perOriginOnly := func(t *testing.T) string {
		state := seen(t)
		if err := os.RemoveAll(filepath.Join(state, "keys")); err != nil {
			t.Fatal(err)
		}
		return state
	}
	// keyAhead remembers for d1's key a checkpoint of d1's origin 100
	// entries ahead of the kernel's (signed with the key), for no origin.
	keyAhead := func(t *testing.T) string {
		state := t.TempDir()
		key, err := kernel.LoadKey(filepath.Join(data("d1"), kernel.ReceiptKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		signer, _ := ledger.NewCheckpointSigner(latest["d1"].Origin, key)
		c, _ := ledger.PeekCheckpoint([]byte(latest["d1"].Note))
		c.Size += 100
		note, err := ledger.SignCheckpoint(signer, c)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(seenCheckpoint{Origin: c.Origin, Note: string(note), SeenAt: "2026-01-01T00:00:00Z"})
		os.MkdirAll(filepath.Dir(keyFile(state)), 0o700)
		os.WriteFile(keyFile(state), b, 0o600)
		return state
	}
	for _, c := range []struct {
		name   string
		state  func(*testing.T) string
		server string
		code   int
		want   []string
	}{
		{"same key and origin again", seen, "d1", 0, []string{"same as the checkpoint seen"}},
		{"same key, another origin", seen, "d2", 1, []string{"ORIGIN CHANGED", latest["d1"].Origin, latest["d2"].Origin}},
		{"another key and origin", seen, "d3", 0, []string{"first checkpoint seen for this origin and key"}},
		{"per-origin state, same origin", perOriginOnly, "d1", 0, []string{"same as the checkpoint seen"}},
		{"per-origin state, another origin", perOriginOnly, "d2", 1, []string{"ORIGIN CHANGED", latest["d1"].Origin, latest["d2"].Origin}},
		{"the key's history is longer", keyAhead, "d1", 1, []string{"INCONSISTENT", "fewer than"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := c.state(t)
			before, _ := os.ReadFile(keyFile(state))
			out, code := checkpoint(c.server, state)
			if code != c.code {
				t.Fatalf("exit %d, want %d:\n%s", code, c.code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Fatalf("no %q in:\n%s", w, out)
				}
			}
			after, err := os.ReadFile(keyFile(state))
			switch {
			case c.code != 0 && string(after) != string(before):
				t.Fatalf("a refusal changed the key's record:\n%s\n%s", before, after)
			case c.code == 0 && c.server == "d1" && (err != nil || !strings.Contains(string(after), latest["d1"].Origin)):
				t.Fatalf("the key's record after an accepted checkpoint: %v %s", err, after)
			}
		})
	}
}

// An older checkpoint than the one remembered (the stable one, marked at
// start, after the latest was seen) is proven a prefix of it and passes,
// and the newer one stays remembered.
func TestCheckpointOlderThanSeen(t *testing.T) {
	sv := initServed(t)
	tok := mintCLI(t, sv.server, sv.admin, "--agent", "a1", "--tools", "echo")
	mustRun(t, "call", "echo", "--token", tok.file, "--arg-str", "text=x", "--server", sv.url)
	state := t.TempDir()
	checkpoint := func(extra ...string) kernel.SignedCheckpoint {
		t.Helper()
		out, stderr, code := run(t, append([]string{"ledger", "checkpoint", "--server", sv.url, "--state", state, "--json"}, extra...)...)
		var sc struct {
			kernel.SignedCheckpoint
			Consistency string `json:"consistency"`
		}
		if err := json.Unmarshal([]byte(out), &sc); code != 0 || err != nil {
			t.Fatalf("ledger checkpoint %v: exit %d %v\n%s%s", extra, code, err, out, stderr)
		}
		return sc.SignedCheckpoint
	}
	latest := checkpoint()
	stable := checkpoint("--stable")
	size := func(sc kernel.SignedCheckpoint) uint64 {
		cp, err := ledger.PeekCheckpoint([]byte(sc.Note))
		if err != nil {
			t.Fatal(err)
		}
		return cp.Size
	}
	if size(stable) >= size(latest) {
		t.Fatalf("the stable checkpoint (size %d) is not older than the latest (size %d)", size(stable), size(latest))
	}
	seen, err := loadSeen(checkpointState{dir: state}.originPath(latest.Origin))
	if err != nil || seen == nil || seen.Note != latest.Note {
		t.Fatalf("remembered after the older one: %+v %v, want the latest", seen, err)
	}
}
