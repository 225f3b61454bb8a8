package syscalls_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/syscalls"
)

// recStager is a Stager that records what a syscall stages, one line per
// effect, and stages nothing else.
type recStager struct {
	kv     kvMap
	staged []string
}

func (s *recStager) WriteFile(r *syscalls.Resource, content []byte, perm fs.FileMode) error {
	s.staged = append(s.staged, fmt.Sprintf("write %s real=%s perm=%#o %q", r.Rel, r.Real, perm, content))
	return nil
}

func (s *recStager) Delete(r *syscalls.Resource) error {
	s.staged = append(s.staged, fmt.Sprintf("delete %s real=%s", r.Rel, r.Real))
	return nil
}

func (s *recStager) PutKV(key string, value json.RawMessage) (uint64, error) {
	v := s.kv[key].version + 1
	s.staged = append(s.staged, fmt.Sprintf("put %s v%d %s", key, v, value))
	return v, nil
}

type kvEntry struct {
	value   json.RawMessage
	version uint64
}

// kvMap is a KVReader over a map.
type kvMap map[string]kvEntry

func (m kvMap) GetKV(key string) (json.RawMessage, uint64, bool, error) {
	e, ok := m[key]
	return e.value, e.version, ok, nil
}

// builtinFixture makes a workspace root:
//
//	hello.txt   "hello world"
//	bin.dat     ff 00 01
//	dup.txt     "x=1\nx=1\n"
//	patch.txt   "alpha beta gamma"
//	sub/a.txt   "A"
//	sub/aaa.txt "aaa"
//	list/a/     directory
//	list/b.txt  "abc"
//	list/c      -> b.txt
//	list/d      a FIFO
//	lin         -> hello.txt
//	fifo        a FIFO
func builtinFixture(t testing.TB) (root string, w *syscalls.Workspace) {
	t.Helper()
	root = t.TempDir()
	files := map[string][]byte{
		"hello.txt":   []byte("hello world"),
		"bin.dat":     {0xff, 0x00, 0x01},
		"dup.txt":     []byte("x=1\nx=1\n"),
		"patch.txt":   []byte("alpha beta gamma"),
		"sub/a.txt":   []byte("A"),
		"sub/aaa.txt": []byte("aaa"),
		"list/b.txt":  []byte("abc"),
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, content, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "list", "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{"list/c": "b.txt", "lin": "hello.txt"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"fifo", "list/d"} {
		if err := syscall.Mkfifo(filepath.Join(root, name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, openWorkspace(t, syscalls.RootSpec{Path: root, Writable: true})
}

// env is what the kernel hands a syscall besides its args.
type env struct {
	w       *syscalls.Workspace
	stage   *recStager
	kv      kvMap
	maxRead int64
}

// execute does what the kernel does before Execute — validate the args,
// resolve the resources — then runs a fresh instance of id.
func execute(t testing.TB, e env, id, args string) (syscalls.Output, error) {
	t.Helper()
	return prepare(t, e, id, args)()
}

// prepare validates args and resolves the resources of a call to id, and
// returns a function running it.
func prepare(t testing.TB, e env, id, args string) func() (syscalls.Output, error) {
	t.Helper()
	r := syscalls.NewRegistry()
	if err := syscalls.RegisterBuiltins(r); err != nil {
		t.Fatal(err)
	}
	entry, ok := r.Get(id)
	if !ok {
		t.Fatalf("no syscall %s", id)
	}
	if err := entry.Validate(json.RawMessage(args)); err != nil {
		t.Fatalf("Validate(%s): %v", args, err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		t.Fatal(err)
	}
	c := &syscalls.Call{Args: json.RawMessage(args), KV: e.kv, MaxReadBytes: e.maxRead}
	if entry.Def.SideEffect.Mutating() {
		c.Stage = e.stage
	}
	for _, ra := range entry.Def.Resources {
		name := m[ra.Arg].(string)
		var res *syscalls.Resource
		switch ra.Kind {
		case syscalls.KindFS:
			var err error
			if res, err = e.w.Resolve(name, ra.Access); err != nil {
				t.Fatalf("Resolve(%q, %s): %v", name, ra.Access, err)
			}
		case syscalls.KindKV:
			res = &syscalls.Resource{Rel: name, Access: ra.Access}
		}
		res.Arg = ra.Arg
		c.Resources = append(c.Resources, res)
	}
	return func() (syscalls.Output, error) { return entry.New().Execute(context.Background(), c) }
}

func decodeObject(t testing.TB, raw json.RawMessage) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		t.Fatalf("result %s is not a JSON object: %v", raw, err)
	}
	return m
}

func TestBuiltins(t *testing.T) {
	hello := []byte("hello world")
	tests := []struct {
		name    string
		id      string
		args    string
		maxRead int64                                               // 1 MiB unless set
		want    string                                              // the result, as JSON; "" to skip
		check   func(t *testing.T, root string, res map[string]any) // more checks of the result
		staged  []string                                            // the effects staged
		wantErr string                                              // a substring of the error
		argsErr bool                                                // the error must be an *ArgsError
	}{
		{name: "echo", id: "echo", args: `{"text":"héllo \u0000 \"x\""}`, want: `{"text":"héllo \u0000 \"x\""}`},
		{name: "echo HTML and line separators", id: "echo", args: `{"text":"<a>&\u2028\u2029"}`, want: `{"text":"<a>&\u2028\u2029"}`},

		{name: "read text", id: "fs.read", args: `{"path":"hello.txt"}`,
			want: `{"path":"hello.txt","size":11,"offset":0,"bytes_returned":11,"truncated":false,"content":"hello world"}`},
		{name: "read binary", id: "fs.read", args: `{"path":"bin.dat"}`,
			want: `{"path":"bin.dat","size":3,"offset":0,"bytes_returned":3,"truncated":false,"content_base64":"/wAB"}`},
		{name: "read at an offset", id: "fs.read", args: `{"path":"hello.txt","offset":6}`,
			want: `{"path":"hello.txt","size":11,"offset":6,"bytes_returned":5,"truncated":false,"content":"world"}`},
		{name: "read past the end", id: "fs.read", args: `{"path":"hello.txt","offset":50}`,
			want: `{"path":"hello.txt","size":11,"offset":50,"bytes_returned":0,"truncated":false,"content":""}`},
		{name: "read max_bytes truncates", id: "fs.read", args: `{"path":"hello.txt","max_bytes":5}`,
			want: `{"path":"hello.txt","size":11,"offset":0,"bytes_returned":5,"truncated":true,"content":"hello"}`},
		{name: "read max_bytes and offset", id: "fs.read", args: `{"path":"hello.txt","offset":2,"max_bytes":3}`,
			want: `{"path":"hello.txt","size":11,"offset":2,"bytes_returned":3,"truncated":true,"content":"llo"}`},
		{name: "read max_bytes equal to the size", id: "fs.read", args: `{"path":"hello.txt","max_bytes":11}`,
			want: `{"path":"hello.txt","size":11,"offset":0,"bytes_returned":11,"truncated":false,"content":"hello world"}`},
		{name: "read capped by MaxReadBytes", id: "fs.read", args: `{"path":"hello.txt"}`, maxRead: 4,
			want: `{"path":"hello.txt","size":11,"offset":0,"bytes_returned":4,"truncated":true,"content":"hell"}`},
		{name: "read max_bytes above MaxReadBytes", id: "fs.read", args: `{"path":"hello.txt","max_bytes":8}`, maxRead: 4,
			want: `{"path":"hello.txt","size":11,"offset":0,"bytes_returned":4,"truncated":true,"content":"hell"}`},
		{name: "read max_bytes below MaxReadBytes", id: "fs.read", args: `{"path":"hello.txt","max_bytes":2}`, maxRead: 4,
			want: `{"path":"hello.txt","size":11,"offset":0,"bytes_returned":2,"truncated":true,"content":"he"}`},
		{name: "read through a symlink", id: "fs.read", args: `{"path":"lin"}`,
			want: `{"path":"lin","size":11,"offset":0,"bytes_returned":11,"truncated":false,"content":"hello world"}`},
		{name: "read a directory", id: "fs.read", args: `{"path":"sub"}`, wantErr: "is a directory"},
		{name: "read the root", id: "fs.read", args: `{"path":"."}`, wantErr: "is a directory"},
		{name: "read a FIFO", id: "fs.read", args: `{"path":"fifo"}`, wantErr: "not a regular file"},
		{name: "read a missing file", id: "fs.read", args: `{"path":"nope.txt"}`, wantErr: "nope.txt"},

		{name: "list", id: "fs.list", args: `{"path":"list"}`,
			want: `{"path":"list","truncated":false,"entries":[
				{"name":"a","type":"dir","size":0},
				{"name":"b.txt","type":"file","size":3},
				{"name":"c","type":"symlink","size":0},
				{"name":"d","type":"other","size":0}]}`},
		{name: "list the root", id: "fs.list", args: `{"path":"."}`,
			check: func(t *testing.T, _ string, res map[string]any) {
				var names []string
				for _, e := range res["entries"].([]any) {
					names = append(names, e.(map[string]any)["name"].(string))
				}
				want := []string{"bin.dat", "dup.txt", "fifo", "hello.txt", "lin", "list", "patch.txt", "sub"}
				if !reflect.DeepEqual(names, want) {
					t.Errorf("names = %v, want %v", names, want)
				}
			}},
		{name: "list a file", id: "fs.list", args: `{"path":"hello.txt"}`, wantErr: "hello.txt"},

		{name: "stat absent", id: "fs.stat", args: `{"path":"sub/nope"}`, want: `{"path":"sub/nope","exists":false}`},
		{name: "stat file", id: "fs.stat", args: `{"path":"hello.txt"}`,
			check: func(t *testing.T, root string, res map[string]any) {
				checkStat(t, res, filepath.Join(root, "hello.txt"), "file", 11, "0644")
				if res["hash"] != digest.Sum(hello) {
					t.Errorf("hash = %v, want %s", res["hash"], digest.Sum(hello))
				}
			}},
		{name: "stat through a symlink", id: "fs.stat", args: `{"path":"lin"}`,
			check: func(t *testing.T, root string, res map[string]any) {
				checkStat(t, res, filepath.Join(root, "hello.txt"), "file", 11, "0644")
				if res["hash"] != digest.Sum(hello) {
					t.Errorf("hash = %v, want %s", res["hash"], digest.Sum(hello))
				}
			}},
		{name: "stat directory", id: "fs.stat", args: `{"path":"sub"}`,
			check: func(t *testing.T, root string, res map[string]any) {
				checkStat(t, res, filepath.Join(root, "sub"), "dir", -1, "0755")
				if _, ok := res["hash"]; ok {
					t.Errorf("a directory has a hash: %v", res["hash"])
				}
			}},
		{name: "stat FIFO", id: "fs.stat", args: `{"path":"fifo"}`,
			check: func(t *testing.T, root string, res map[string]any) {
				checkStat(t, res, filepath.Join(root, "fifo"), "other", 0, "")
				if _, ok := res["hash"]; ok {
					t.Errorf("a FIFO has a hash: %v", res["hash"])
				}
			}},

		{name: "write with mode", id: "fs.write", args: `{"path":"new.txt","content":"data","mode":"0600"}`,
			want:   fmt.Sprintf(`{"path":"new.txt","size":4,"hash":%q}`, digest.Sum([]byte("data"))),
			staged: []string{`write new.txt real=new.txt perm=0600 "data"`}},
		{name: "write with a 3-digit mode", id: "fs.write", args: `{"path":"sub/x.sh","content":"","mode":"755"}`,
			want:   fmt.Sprintf(`{"path":"sub/x.sh","size":0,"hash":%q}`, digest.Sum(nil)),
			staged: []string{`write sub/x.sh real=sub/x.sh perm=0755 ""`}},
		{name: "write replacing a file, mode kept", id: "fs.write", args: `{"path":"hello.txt","content":"bye"}`,
			want:   fmt.Sprintf(`{"path":"hello.txt","size":3,"hash":%q}`, digest.Sum([]byte("bye"))),
			staged: []string{`write hello.txt real=hello.txt perm=0 "bye"`}},
		{name: "write a directory", id: "fs.write", args: `{"path":"sub","content":"x"}`, wantErr: "is a directory"},

		{name: "patch one match", id: "fs.patch", args: `{"path":"patch.txt","old":"beta","new":"BETA!"}`,
			want:   fmt.Sprintf(`{"path":"patch.txt","size":17,"hash":%q}`, digest.Sum([]byte("alpha BETA! gamma"))),
			staged: []string{`write patch.txt real=patch.txt perm=0 "alpha BETA! gamma"`}},
		{name: "patch no match", id: "fs.patch", args: `{"path":"patch.txt","old":"delta","new":"x"}`, wantErr: "not found", argsErr: true},
		{name: "patch two matches", id: "fs.patch", args: `{"path":"dup.txt","old":"x=1","new":"x=2"}`, wantErr: "occurs more than once", argsErr: true},
		{name: "patch two overlapping matches", id: "fs.patch", args: `{"path":"sub/aaa.txt","old":"aa","new":"X"}`, wantErr: "occurs more than once", argsErr: true},
		{name: "patch a fifo", id: "fs.patch", args: `{"path":"fifo","old":"a","new":"b"}`, wantErr: "not a regular file"},
		{name: "patch a missing file", id: "fs.patch", args: `{"path":"nope.txt","old":"a","new":"b"}`, wantErr: "no such file"},

		{name: "delete a file", id: "fs.delete", args: `{"path":"sub/a.txt"}`,
			want: `{"path":"sub/a.txt","was_dir":false}`, staged: []string{"delete sub/a.txt real=sub/a.txt"}},
		{name: "delete a directory", id: "fs.delete", args: `{"path":"sub"}`,
			want: `{"path":"sub","was_dir":true}`, staged: []string{"delete sub real=sub"}},
		{name: "delete a symlink", id: "fs.delete", args: `{"path":"lin"}`,
			want: `{"path":"lin","was_dir":false}`, staged: []string{"delete lin real=lin"}},
		{name: "delete a missing file", id: "fs.delete", args: `{"path":"nope.txt"}`, wantErr: "no such file"},

		{name: "kv.get found", id: "kv.get", args: `{"key":"cfg"}`, want: `{"key":"cfg","found":true,"value":{"a":[1,2]},"version":3}`},
		{name: "kv.get not found", id: "kv.get", args: `{"key":"nope"}`, want: `{"key":"nope","found":false,"value":null,"version":0}`},
		{name: "kv.put existing", id: "kv.put", args: `{"key":"cfg","value":{"a":null}}`,
			want: `{"key":"cfg","version":4}`, staged: []string{`put cfg v4 {"a":null}`}},
		{name: "kv.put new", id: "kv.put", args: `{"key":"fresh","value":"s"}`,
			want: `{"key":"fresh","version":1}`, staged: []string{`put fresh v1 "s"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, w := builtinFixture(t)
			before := snapshot(t, root)
			kv := kvMap{"cfg": {value: json.RawMessage(`{"a":[1,2]}`), version: 3}}
			e := env{w: w, stage: &recStager{kv: kv}, kv: kv, maxRead: 1 << 20}
			if tt.maxRead != 0 {
				e.maxRead = tt.maxRead
			}
			type result struct {
				out syscalls.Output
				err error
			}
			// Run in a goroutine, so a syscall that blocks (reading a
			// FIFO) fails the test rather than hanging it.
			run := prepare(t, e, tt.id, tt.args)
			done := make(chan result, 1)
			go func() {
				out, err := run()
				done <- result{out, err}
			}()
			var res result
			select {
			case res = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Execute did not return")
			}
			if !reflect.DeepEqual(e.stage.staged, tt.staged) {
				t.Errorf("staged %q, want %q", e.stage.staged, tt.staged)
			}
			// A syscall stages its effects; it never makes them itself.
			if after := snapshot(t, root); !reflect.DeepEqual(before, after) {
				t.Errorf("Execute changed the workspace")
			}
			if tt.wantErr != "" {
				if res.err == nil {
					t.Fatalf("Execute = %s, want an error mentioning %q", res.out.Result, tt.wantErr)
				}
				if !strings.Contains(res.err.Error(), tt.wantErr) {
					t.Errorf("error %q does not mention %q", res.err, tt.wantErr)
				}
				var ae *syscalls.ArgsError
				if errors.As(res.err, &ae) != tt.argsErr {
					t.Errorf("error %v (%T): *ArgsError %v, want %v", res.err, res.err, !tt.argsErr, tt.argsErr)
				}
				return
			}
			if res.err != nil {
				t.Fatalf("Execute: %v", res.err)
			}
			got := decodeObject(t, res.out.Result)
			if c := res.out.Canonical; c != nil {
				// A result's canonical form, when the syscall writes it,
				// is the one the kernel would compute.
				if want, err := jcs.Canonicalize(res.out.Result); err != nil || string(c) != string(want) {
					t.Errorf("canonical result\n got %s\nwant %s (%v)", c, want, err)
				}
			}
			if tt.want != "" {
				if want := decodeObject(t, json.RawMessage(tt.want)); !reflect.DeepEqual(got, want) {
					t.Errorf("result\n got %s\nwant %s", res.out.Result, tt.want)
				}
			}
			if tt.check != nil {
				tt.check(t, root, got)
			}
		})
	}
}

// checkStat checks an fs.stat result against the file at p; size -1 and
// mode "" are not checked.
func checkStat(t *testing.T, res map[string]any, p, typ string, size int64, mode string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if res["exists"] != true || res["type"] != typ {
		t.Errorf("exists %v type %v, want true %s", res["exists"], res["type"], typ)
	}
	if size >= 0 && res["size"] != float64(size) {
		t.Errorf("size = %v, want %d", res["size"], size)
	}
	if mode != "" && res["mode"] != mode {
		t.Errorf("mode = %v, want %s", res["mode"], mode)
	}
	mtime, err := time.Parse(time.RFC3339Nano, fmt.Sprint(res["mtime"]))
	if err != nil || !mtime.Equal(fi.ModTime()) {
		t.Errorf("mtime = %v (%v), want %v", res["mtime"], err, fi.ModTime().UTC())
	}
}

// TestFSReadLargeFile reads a file larger than the cap in pieces, with
// offset and max_bytes, and checks the pieces add up.
func TestFSReadLargeFile(t *testing.T) {
	root, w := builtinFixture(t)
	content := []byte(strings.Repeat("0123456789abcdef", 1000))
	if err := os.WriteFile(filepath.Join(root, "big.txt"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	const cap = 4096
	e := env{w: w, maxRead: cap}
	var got []byte
	for off := 0; ; {
		out, err := execute(t, e, "fs.read", fmt.Sprintf(`{"path":"big.txt","offset":%d}`, off))
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Content       string `json:"content"`
			BytesReturned int    `json:"bytes_returned"`
			Truncated     bool   `json:"truncated"`
			Size          int    `json:"size"`
		}
		if err := json.Unmarshal(out.Result, &r); err != nil {
			t.Fatal(err)
		}
		if r.BytesReturned > cap || r.BytesReturned != len(r.Content) || r.Size != len(content) {
			t.Fatalf("at offset %d: bytes_returned %d, content %d bytes, size %d", off, r.BytesReturned, len(r.Content), r.Size)
		}
		got = append(got, r.Content...)
		off += r.BytesReturned
		if !r.Truncated {
			break
		}
	}
	if string(got) != string(content) {
		t.Errorf("pieces add up to %d bytes, want the %d of the file", len(got), len(content))
	}
}

// TestResultBytes: fs.read and echo, which write their results directly
// when json.Marshal would write the same bytes, answer exactly what
// json.Marshal writes, for text that needs no escape and text that does.
func TestResultBytes(t *testing.T) {
	root, w := builtinFixture(t)
	e := env{w: w, stage: &recStager{}, kv: kvMap{}, maxRead: 1 << 20}
	for i, text := range []string{"plain text\n", "", "<b>&amp;</b>", "line\u2028sep", "tab\t\"q\" \\ \x01", "é中𝄞", "\xff\xfe binary", "a\x7fb"} {
		name := fmt.Sprintf("f%d.txt", i)
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		read := map[string]any{"path": name, "size": len(text), "offset": 0, "bytes_returned": len(text), "truncated": false}
		if utf8.ValidString(text) {
			read["content"] = text
		} else {
			read["content_base64"] = base64.StdEncoding.EncodeToString([]byte(text))
		}
		args, _ := json.Marshal(map[string]string{"text": text})
		var echoed struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(args, &echoed); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			id, args string
			want     any
		}{
			{"fs.read", fmt.Sprintf(`{"path":%q}`, name), read},
			{"echo", string(args), echoed},
		} {
			out, err := prepare(t, e, c.id, c.args)()
			if err != nil {
				t.Fatalf("%s %s: %v", c.id, c.args, err)
			}
			want, _ := json.Marshal(c.want)
			if string(out.Result) != string(want) {
				t.Errorf("%s %s:\n got %s\nwant %s", c.id, c.args, out.Result, want)
			}
		}
	}
}

// TestFSReadConcurrentBuffers: fs.read reads into pooled buffers; reads
// of files of many sizes (some past the pooled size, some binary) at
// once each return their own file's bytes, never another read's.
func TestFSReadConcurrentBuffers(t *testing.T) {
	root, w := builtinFixture(t)
	e := env{w: w, maxRead: 1 << 20}
	files := map[string][]byte{}
	for i, n := range []int{0, 1, 100, 1024, 5000, 70_000, 200_000} {
		b := make([]byte, n)
		for j := range b {
			b[j] = byte('a' + (i+j)%26)
		}
		if i%3 == 2 && n > 0 {
			b[0] = 0xff // not UTF-8: answered in base64
		}
		name := fmt.Sprintf("f%d", i)
		files[name] = b
		if err := os.WriteFile(filepath.Join(root, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 20 {
				for name, want := range files {
					out, err := execute(t, e, "fs.read", `{"path":"`+name+`"}`)
					if err != nil {
						t.Error(err)
						return
					}
					var r struct {
						Content       *string `json:"content"`
						ContentBase64 string  `json:"content_base64"`
					}
					if err := json.Unmarshal(out.Result, &r); err != nil {
						t.Error(err)
						return
					}
					got := []byte(r.ContentBase64)
					if r.Content != nil {
						got = []byte(*r.Content)
					} else if got, err = base64.StdEncoding.DecodeString(r.ContentBase64); err != nil {
						t.Error(err)
						return
					}
					if !bytes.Equal(got, want) {
						t.Errorf("goroutine %d: %s read %d bytes that are not the file's %d", g, name, len(got), len(want))
						return
					}
				}
			}
		})
	}
	wg.Wait()
}
