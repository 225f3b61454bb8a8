package syscalls

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// readWays are openRead's two ways of opening: openat2, and os.Root
// where openat2 is missing.
var readWays = []struct {
	name    string
	missing bool // openat2Missing
}{{"openat2", false}, {"os.Root", true}}

// TestReadStaysInRoot: fs.read opens the path it was given inside its
// root at the time of the open, whatever replaced it since it was
// resolved: a link to outside, absolute or relative, in place of the file
// or of a directory on the way, is refused; a link inside is followed.
// Both ways of opening (openat2, and os.Root where openat2 is missing)
// are held to it.
func TestReadStaysInRoot(t *testing.T) {
	for _, way := range readWays {
		t.Run(way.name, func(t *testing.T) {
			openat2Missing.Store(way.missing)
			defer openat2Missing.Store(false)
			cases := []struct {
				name    string
				path    string                 // resolved, then swap runs
				swap    func(root, out string) // what replaces it
				want    string                 // content read; "" for an error
				wantErr string
			}{
				{"unchanged", "a.txt", func(root, out string) {}, "inside", ""},
				{"absolute link out", "a.txt", func(root, out string) {
					replace(t, filepath.Join(root, "a.txt"), filepath.Join(out, "secret.txt"))
				}, "", "escapes"},
				{"relative link out", "a.txt", func(root, out string) {
					replace(t, filepath.Join(root, "a.txt"), "../out/secret.txt")
				}, "", "escapes"},
				{"directory linked out", "d/f.txt", func(root, out string) {
					if err := os.RemoveAll(filepath.Join(root, "d")); err != nil {
						t.Fatal(err)
					}
					replace(t, filepath.Join(root, "d"), out)
				}, "", "escapes"},
				{"link inside", "a.txt", func(root, out string) {
					replace(t, filepath.Join(root, "a.txt"), "d/f.txt")
				}, "in d", ""},
			}
			for _, tc := range cases {
				t.Run(tc.name, func(t *testing.T) {
					dir := t.TempDir()
					root, out := filepath.Join(dir, "root"), filepath.Join(dir, "out")
					for p, content := range map[string]string{
						filepath.Join(root, "a.txt"): "inside", filepath.Join(root, "d", "f.txt"): "in d",
						filepath.Join(out, "secret.txt"): "secret", filepath.Join(out, "f.txt"): "secret",
					} {
						if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
							t.Fatal(err)
						}
						if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
							t.Fatal(err)
						}
					}
					w, err := OpenWorkspace([]RootSpec{{Path: root}})
					if err != nil {
						t.Fatal(err)
					}
					defer w.Close()
					r, err := w.Resolve(tc.path, AccessRead)
					if err != nil {
						t.Fatal(err)
					}
					tc.swap(root, out)
					got, err := readResource(r, tc.path)
					switch {
					case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
						t.Fatalf("read %s: content %q, error %v; want an error with %q", tc.path, got, err, tc.wantErr)
					case tc.wantErr == "" && (err != nil || got != tc.want):
						t.Fatalf("read %s: content %q, error %v; want %q", tc.path, got, err, tc.want)
					}
				})
			}
		})
	}
}

// TestReadAfterClose: a resource of a closed workspace opens nothing
// (the root's descriptor is not used after it was closed, when another
// open may have been given its number).
func TestReadAfterClose(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := OpenWorkspace([]RootSpec{{Path: root}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := w.Resolve("a.txt", AccessRead)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if got, err := readResource(r, "a.txt"); err == nil {
		t.Fatalf("read after Close = %q, want an error", got)
	}
}

// readResource runs fs.read of path on the resolved r and returns the
// content it read.
func readResource(r *Resource, path string) (string, error) {
	args, _ := json.Marshal(map[string]string{"path": path})
	out, err := (&fsRead{}).Execute(context.Background(), &Call{Args: args, Resources: []*Resource{r}, MaxReadBytes: 1 << 20})
	if err != nil {
		return "", err
	}
	var res struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(out.Result, &res); err != nil {
		return "", err
	}
	return res.Content, nil
}

// replace puts a symbolic link to target at p, in place of what is there.
func replace(t *testing.T, p, target string) {
	t.Helper()
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkFSRead is fs.read of a 1 KiB file on a resolved resource.
func BenchmarkFSRead(b *testing.B) {
	for _, way := range readWays {
		b.Run(way.name, func(b *testing.B) {
			openat2Missing.Store(way.missing)
			defer openat2Missing.Store(false)
			root := b.TempDir()
			if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte(strings.Repeat("x", 1024)), 0o644); err != nil {
				b.Fatal(err)
			}
			w, err := OpenWorkspace([]RootSpec{{Path: root}})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			r, err := w.Resolve("a.txt", AccessRead)
			if err != nil {
				b.Fatal(err)
			}
			args := json.RawMessage(`{"path":"a.txt"}`)
			b.ReportAllocs()
			var before, after syscall.Rusage
			syscall.Getrusage(syscall.RUSAGE_SELF, &before)
			for b.Loop() {
				if _, err := (&fsRead{}).Execute(context.Background(), &Call{Args: args, Resources: []*Resource{r}, MaxReadBytes: 1 << 20}); err != nil {
					b.Fatal(err)
				}
			}
			syscall.Getrusage(syscall.RUSAGE_SELF, &after)
			cpu := after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano()
			b.ReportMetric(float64(cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}

// TestPreadUpTo: whatever the size the file was stat'd at (known), the
// read returns what the file holds from the offset, up to max bytes; a
// procfs file, which stats as 0 bytes and returns a buffer's worth a
// read, is read whole.
func TestPreadUpTo(t *testing.T) {
	content := strings.Repeat("0123456789", 500) // 5,000 bytes
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name            string
		off, max, known int64
	}{
		{"the size stat'd", 0, 1 << 20, 5000},
		{"the file grew since", 0, 1 << 20, 100},
		{"the file grew since, from an offset", 4000, 1 << 20, 10},
		{"the file shrank since", 0, 1 << 20, 9000},
		{"nothing known", 0, 1 << 20, 0},
		{"up to max", 0, 1001, 5000},
		{"up to max, the file grew", 100, 1001, 10},
		{"past the end", 6000, 1 << 20, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, b := range [][]byte{nil, make([]byte, 0, 64<<10)} {
				got, err := preadUpTo(b, int(f.Fd()), c.off, c.max, c.known)
				want := content[min(c.off, 5000):min(c.off+c.max, 5000)]
				if err != nil || string(got) != want {
					t.Fatalf("buffer of %d: %d bytes, %v; want %d bytes", cap(b), len(got), err, len(want))
				}
			}
		})
	}
}

// TestPreadUpToProcfs: a procfs file stats as 0 bytes and returns one
// buffer's worth a read; fs.read's reading takes it all, as a plain read
// to the end does.
func TestPreadUpToProcfs(t *testing.T) {
	// Long enough to take several reads: the mappings of this process,
	// with their sizes.
	const name = "/proc/self/smaps"
	f, err := os.Open(name)
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	got, err := preadUpTo(nil, int(f.Fd()), 0, 1<<24, 0)
	if err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	// The mappings may change between the two reads; their count of
	// lines hardly does, and a cut read loses most of them.
	if len(whole) < 16<<10 {
		t.Skipf("%s holds only %d bytes", name, len(whole))
	}
	if n, m := strings.Count(string(got), "\n"), strings.Count(string(whole), "\n"); n < m*9/10 {
		t.Fatalf("%d bytes (%d lines) read of %s, which holds %d bytes (%d lines)", len(got), n, name, len(whole), m)
	}
}
