package syscalls_test

import (
	"encoding/json"
	"testing"

	"github.com/capkernel/capkernel/syscalls"
)

func BenchmarkResolve(b *testing.B) {
	tr := newTree(b)
	w := tr.workspace(b)
	benchmarks := []struct {
		name   string
		path   string
		access syscalls.Access
	}{
		{"read file", "sub/inner.txt", syscalls.AccessRead},
		{"read through symlinked parent", "ldir/f.txt", syscalls.AccessRead},
		{"write new file", "sub/new.txt", syscalls.AccessWrite},
	}
	for _, bm := range benchmarks {
		b.Run(bm.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := w.Resolve(bm.path, bm.access); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkValidateWriteArgs(b *testing.B) {
	r := syscalls.NewRegistry()
	if err := syscalls.RegisterBuiltins(r); err != nil {
		b.Fatal(err)
	}
	e, _ := r.Get("fs.write")
	args := json.RawMessage(`{"path":"src/main.go","content":"package main\n\nfunc main() {}\n","mode":"0644"}`)
	for b.Loop() {
		if err := e.Validate(args); err != nil {
			b.Fatal(err)
		}
	}
}
