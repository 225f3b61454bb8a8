package sandbox

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// BenchmarkProtections measures what each protection of the profile adds
// to a bare bwrap running true, all interleaved in one loop (so the
// differences hold on a shared machine): bwrap with the bare benchmark's
// options, then with one protection more each, then with all of a run's
// protections (sh init instead of true, unshare's user namespace
// first). Each variant is reported as <name>-ms/op.
//
//	GOEXPERIMENT=jsonv2 go test -run='^$' -bench=Protections -benchtime=40x ./sandbox/
func BenchmarkProtections(b *testing.B) {
	if err := Available(); err != nil {
		b.Fatal(err)
	}
	ws := b.TempDir()
	etc, err := buildEtc(b.TempDir(), 1000)
	if err != nil {
		b.Fatal(err)
	}
	defer etc.st.remove()
	etcDirs := etcDirBinds()
	bare := []string{"--die-with-parent", "--new-session", "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
		"--unshare-net", "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--ro-bind", ws, ws, "--chdir", ws,
		"--clearenv"}
	with := func(extra ...string) []string { return slices.Concat(bare, extra) }
	all := with(append([]string{"--uid", "1000", "--gid", "1000", "--disable-userns", "--unshare-cgroup-try", "--hostname", "sandbox",
		"--as-pid-1", "--ro-bind", etc.dir, "/etc"}, etcDirs...)...)
	variants := []struct {
		name string
		argv []string
	}{
		{"bare", slices.Concat([]string{"bwrap"}, bare, []string{"--", "true"})},
		{"uid-1000", slices.Concat([]string{"bwrap"}, with("--uid", "1000", "--gid", "1000"), []string{"--", "true"})},
		{"disable-userns", slices.Concat([]string{"bwrap"}, with("--disable-userns"), []string{"--", "true"})},
		{"cgroup-uts", slices.Concat([]string{"bwrap"}, with("--unshare-cgroup-try", "--hostname", "sandbox"), []string{"--", "true"})},
		{"etc-snapshot", slices.Concat([]string{"bwrap"}, with("--ro-bind", etc.dir, "/etc"), []string{"--", "true"})},
		{"etc-snapshot-and-dirs", slices.Concat([]string{"bwrap"}, with(append([]string{"--ro-bind", etc.dir, "/etc"}, etcDirs...)...), []string{"--", "true"})},
		{"sh-init", slices.Concat([]string{"bwrap"}, with("--as-pid-1"), []string{"--", "/bin/sh", "-c", "true & wait $!"})},
		{"all", slices.Concat([]string{"bwrap"}, all, []string{"--", "/bin/sh", "-c", "true & wait $!"})},
		{"all-in-unshare", slices.Concat([]string{"unshare", "--user", "--map-root-user", "--mount", "--", "bwrap"}, all, []string{"--", "/bin/sh", "-c", "true & wait $!"})},
	}
	if os.Geteuid() != 0 {
		variants = variants[:len(variants)-1] // unshare is a root kernel's
	}
	took := make([]time.Duration, len(variants))
	n := 0
	for b.Loop() {
		for i, v := range variants {
			t0 := time.Now()
			if out, err := exec.Command(v.argv[0], v.argv[1:]...).CombinedOutput(); err != nil {
				b.Fatalf("%s: %v: %s", v.name, err, out)
			}
			took[i] += time.Since(t0)
		}
		n++
	}
	for i, v := range variants {
		b.ReportMetric(float64(took[i].Microseconds())/float64(n)/1000, v.name+"-ms/op")
	}
}
