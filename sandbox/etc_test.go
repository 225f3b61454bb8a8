package sandbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The /etc signature changes when an entry is added, removed, rewritten
// (size or modification time) or re-moded, and when a directory entry
// changes; it stays the same otherwise.
func TestEtcSignature(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("hosts", "127.0.0.1 localhost\n")
	write("ssl/openssl.cnf", "x\n")
	if err := os.MkdirAll(filepath.Join(dir, "ssl/certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	old := time.Unix(1_700_000_000, 0)
	for _, c := range []struct {
		name   string
		change func()
	}{
		{"nothing", func() {}},
		{"added", func() { write("resolv.conf", "nameserver 1.1.1.1\n") }},
		{"rewritten, other size", func() { write("hosts", "127.0.0.1 localhost sandbox\n") }},
		{"touched", func() { os.Chtimes(filepath.Join(dir, "hosts"), old, old) }},
		{"re-moded", func() { os.Chmod(filepath.Join(dir, "hosts"), 0o600) }},
		{"directory changed", func() { write("ssl/certs/new.pem", "pem\n") }},
		{"removed", func() { os.Remove(filepath.Join(dir, "ssl/openssl.cnf")) }},
	} {
		before := etcSignature(dir)
		c.change()
		after := etcSignature(dir)
		if changed := before != after; changed != (c.name != "nothing") {
			t.Errorf("%s: signature changed %v\nbefore %s\nafter  %s", c.name, changed, before, after)
		}
	}
}
