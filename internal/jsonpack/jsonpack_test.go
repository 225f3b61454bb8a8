package jsonpack

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/jcs"
)

// samples are stored values of the kinds the kernel keeps, and edge cases
// of every token.
var samples = []string{
	`{"body":{"agent_id":"agent-1","args_commitment":"blake3:7389b6c342b0fa56ee6dffca9a961ca98c53fac02c89e9890c1581c3b5f277e4","autonomy_mode":"autopilot","capability_token_id":"01a2183b-b4f1-767b-b592-e329259072a0","operation_id":"01a2183b-b4f2-73b4-842b-7bfe5875660f","payload_depth":"full","risk_score":0.1,"started_at":"2026-11-26T14:21:35.858237861Z","state_snapshot_id":"","status":"ok","tool_id":"fs.read","tx_outcome":"no_op"},"entry_hash":"blake3:a64db497f3ff0ba6d1520cab84a6a5e702f1e91572ae9751613014e8e2f69dc5","kind":"audit","prev_hash":"blake3:089f2318f73e3bc32ee8835c8de5240126b09b677f212a18aae1d5395b2b2977","seq":2,"time":"2026-11-26T14:21:35.859780150Z"}`,
	`{"tool_id":"fs.read","state_snapshot_id":"2:blake3:a64db497f3ff0ba6d1520cab84a6a5e702f1e91572ae9751613014e8e2f69dc5","risk_basis":["read in scope"],"receipt_id":"r2-a64db497f3ff0ba6","ledger_seq":2,"replayed":false,"audit_salt":"be3d3b6a23fafb4de18fb41db8609db9221604bd7e0e3bc496243545ce55e0fa"}`,
	`{"content":"line\n\"quoted\" \\ \u00e9 \ud83d\ude00 é","n":[0,1,31,32,127,128,18446744073709551615,18446744073709551616,-1,-0,0.5,1e10,-2.5E-3,007],"t":[true,false,null]}`,
	`{"times":["2026-01-01T00:00:00Z","1970-01-01T00:00:00.1Z","0000-01-01T00:00:00.000000000Z","9999-12-31T23:59:59.999999999Z","1969-12-31T23:59:59.5Z","2026-02-30T00:00:00Z","2026-13-01T00:00:00Z","2026-01-01T24:00:00Z","2026-01-01T00:00:60Z","2026-01-01t00:00:00Z","2026-01-01T00:00:00.Z","2026-01-01T00:00:00.0000000000Z","2024-02-29T12:00:00+01:00"]}`,
	`{"ids":["01A2183B-B4F1-767B-B592-E329259072A0","01a2183b-b4f1-767b-b592-e329259072a","01a2183bxb4f1-767b-b592-e329259072a0","blake3:A64DB497F3FF0BA6D1520CAB84A6A5E702F1E91572AE9751613014E8E2F69DC5","sha256:a64db497f3ff0ba6d1520cab84a6a5e702f1e91572ae9751613014e8e2f69dc5","deadbeef","deadbee","DEADBEEF","blake3:"]}`,
	`[]`, `{}`, `[[[]],{"a":{}}]`, `"x"`, `0`, `-12`, `true`, `null`, `"` + strings.Repeat("long ", 40) + `"`,
	`{"` + strings.Repeat("k", 70) + `":1}`,
	// Not packed: whitespace, not JSON, empty, already tagged.
	`{"a": 1}`, ` {}`, `{"a":1`, `{"a":1}x`, `{a:1}`, `nul`, `{"a":"x}`, "", "\x01\xe4", `{"a":01}`, `{"a":1.}`, `{"a":+1}`, `{"a":--1}`,
}

// TestRoundTrip: Unpack(Pack(b)) is b for every sample, and values that
// are JSON without whitespace pack smaller.
func TestRoundTrip(t *testing.T) {
	for _, s := range samples {
		v := Pack(nil, []byte(s))
		back, err := Unpack(nil, v)
		if err != nil || string(back) != s {
			t.Errorf("Unpack(Pack(%q)) = %q, %v", s, back, err)
		}
		if len(v) > len(s) && !strings.HasPrefix(s, "\x01") {
			t.Errorf("Pack(%q) is %d bytes, longer than its input", s, len(v))
		}
	}
	// The kernel's records pack to less than half.
	for _, s := range samples[:2] {
		if v := Pack(nil, []byte(s)); !Packed(v) || 2*len(v) > len(s) {
			t.Errorf("Pack(%.40q…) = %d bytes of %d, packed %v", s, len(v), len(s), Packed(v))
		}
	}
}

// TestPackAppends: Pack and Unpack append to dst and leave its bytes alone.
func TestPackAppends(t *testing.T) {
	dst := []byte("prefix")
	v := Pack(dst, []byte(samples[0]))
	if !bytes.HasPrefix(v, []byte("prefix")) || !Packed(v[6:]) {
		t.Fatalf("Pack(dst) = %q", v)
	}
	back, err := Unpack([]byte("p:"), v[6:])
	if err != nil || string(back) != "p:"+samples[0] {
		t.Fatalf("Unpack(dst) = %q, %v", back, err)
	}
	raw := Pack([]byte("p:"), []byte(`{"a": 1}`))
	if string(raw) != `p:{"a": 1}` {
		t.Fatalf("Pack of unpackable = %q", raw)
	}
}

// TestNotPacked: values that do not start with Tag come back as they are,
// whatever they hold.
func TestNotPacked(t *testing.T) {
	for _, s := range []string{`{"a":1}`, "", "\x00\x01", "garbage"} {
		back, err := Unpack(nil, []byte(s))
		if err != nil || string(back) != s {
			t.Errorf("Unpack(%q) = %q, %v", s, back, err)
		}
	}
}

// TestUndecodable: damaged packed values are errors, never panics or
// partial output.
func TestUndecodable(t *testing.T) {
	good := Pack(nil, []byte(samples[0]))
	tests := []struct {
		name string
		v    []byte
		want string
	}{
		{"tag only", []byte{Tag}, "truncated"},
		{"truncated", good[:len(good)-1], "truncated"},
		{"trailing", append(bytes.Clone(good), 0), "bytes after the value"},
		{"unknown token", []byte{Tag, 0xff}, "unknown token"},
		{"unknown dictionary entry", []byte{Tag, opObj, 0x7f, opNull, opEnd}, "dictionary entry 127"},
		{"value as name", []byte{Tag, opObj, opNull, opNull, opEnd}, "not a member name"},
		{"end as value", []byte{Tag, opObj, 0, opEnd}, "unknown token"},
		{"end at top", []byte{Tag, opEnd}, "outside a container"},
		{"short digest", []byte{Tag, opDigest, 1, 2}, "truncated"},
		{"long string", []byte{Tag, opStr, 0xff, 0xff, 0x03, 'a'}, "truncated"},
		{"bad varint", []byte{Tag, opUint, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, "malformed varint"},
		{"fraction too long", []byte{Tag, opTime, 10, 0, 0}, "time out of range"},
		{"fraction too big", []byte{Tag, opTime, 1, 0, 10}, "time out of range"},
		{"year 10000", append(append([]byte{Tag, opTime, 0}, varint(maxSec)...), 0), "time out of range"},
		{"unclosed", []byte{Tag, opArr, opArr, opEnd}, "truncated"},
		{"reference to the tag", []byte{Tag, opArr, opShort + 1, 'a', opRef, 0, opEnd}, "no string token"},
		{"reference to itself", []byte{Tag, opArr, opShort + 1, 'a', opRef, 4, opEnd}, "no string token"},
		{"reference ahead", []byte{Tag, opArr, opRef, 4, opShort + 1, 'a', opEnd}, "no string token"},
		{"reference to a number", []byte{Tag, opArr, opSmall + 1, opRef, 2, opEnd}, "no string token"},
		{"reference across itself", []byte{Tag, opArr, opShort + 5, 'a', opRef, 2, opEnd}, "truncated"},
		{"reference as name", []byte{Tag, opObj, opShort + 1, 'a', opNull, opRef, 2, opNull, opEnd}, "not a member name"},
		{"references beyond the budget", refFlood(), "stand for more than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := Unpack([]byte("dst"), tc.v)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Unpack(%x) = %q, %v; want an error with %q", tc.v, out, err, tc.want)
			}
			if string(out) != "dst" {
				t.Fatalf("Unpack appended %q on error", out)
			}
		})
	}
}

func varint(v int64) []byte {
	var e encoder
	e.out = binary.AppendVarint(e.out, v)
	return e.out
}

// FuzzRoundTrip: for every input Unpack(Pack(b)) == b, and Unpack of any
// bytes returns an error or output, never a panic.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range samples {
		f.Add([]byte(s))
		f.Add(Pack(nil, []byte(s)))
	}
	f.Add(PackRefs(nil, []byte(refSample)))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, pack := range []func(dst, src []byte) []byte{Pack, PackRefs} {
			v := pack(nil, b)
			back, err := Unpack(nil, v)
			if err != nil || !bytes.Equal(back, b) {
				t.Fatalf("Unpack(Pack(%q)) = %q, %v", b, back, err)
			}
			if len(v) > len(b) && b[0] != Tag {
				t.Fatalf("Pack(%q) grew to %d bytes", b, len(v))
			}
		}
		if out, err := Unpack(nil, b); err == nil && len(out) > (refBudget+32)*len(b) { // any bytes: no panic, bounded output
			t.Fatalf("Unpack of %d bytes gave %d", len(b), len(out))
		}
	})
}

// BenchmarkUnpack measures unpacking an audit record (ns per record).
func BenchmarkUnpack(b *testing.B) {
	v := Pack(nil, []byte(samples[0]))
	out := make([]byte, 0, 2*len(samples[0]))
	b.SetBytes(int64(len(samples[0])))
	for b.Loop() {
		out, _ = Unpack(out[:0], v)
	}
}

// BenchmarkPack measures packing an audit record.
func BenchmarkPack(b *testing.B) {
	out := make([]byte, 0, 2*len(samples[0]))
	b.SetBytes(int64(len(samples[0])))
	for b.Loop() {
		out = Pack(out[:0], []byte(samples[0]))
	}
}

// TestBuild: a value appended piece by piece unpacks to the JSON its pieces
// name, the same bytes Pack would store for it.
func TestBuild(t *testing.T) {
	body := `{"a":[1,"x"],"operation_id":"01a2183b-b4f2-73b4-842b-7bfe5875660f"}`
	var h [32]byte
	h[0], h[31] = 0xab, 0x01
	v := AppendObject([]byte{Tag})
	v = AppendName(v, "body")
	v, ok := AppendValue(v, []byte(body))
	if !ok {
		t.Fatal("AppendValue refused a JSON object")
	}
	v = AppendDigest(AppendName(v, "entry_hash"), &h)
	v = AppendString(AppendName(v, "kind"), "audit")
	v = AppendString(AppendName(v, "odd name"), "2026-11-26T14:21:35.859780150Z")
	v = AppendUint(AppendName(v, "seq"), 7)
	v = AppendEnd(AppendUint(AppendName(v, "big"), 1<<40))
	want := `{"body":` + body + `,"entry_hash":"blake3:ab` + strings.Repeat("00", 30) + `01","kind":"audit","odd name":"2026-11-26T14:21:35.859780150Z","seq":7,"big":1099511627776}`
	back, err := Unpack(nil, v)
	if err != nil || string(back) != want {
		t.Fatalf("built value unpacks to %q, %v; want %q", back, err, want)
	}
	if p := Pack(nil, []byte(want)); !bytes.Equal(p, v) {
		t.Fatalf("Pack stores %x, the built value is %x", p, v)
	}
	for _, bad := range []string{`{"a": 1}`, `{"a":1`, ``, `[1]x`} {
		if out, ok := AppendValue([]byte("dst"), []byte(bad)); ok || string(out) != "dst" {
			t.Errorf("AppendValue(%q) = %q, %v", bad, out, ok)
		}
	}
}

// TestDepth: values nested up to maxDepth pack; deeper ones are stored as
// is, and a packed value nested deeper does not unpack.
func TestDepth(t *testing.T) {
	for _, n := range []int{maxDepth, maxDepth + 1, 10 * maxDepth} {
		s := strings.Repeat("[", n) + `"commitments_only"` + strings.Repeat("]", n)
		v := Pack(nil, []byte(s))
		if Packed(v) != (n <= maxDepth) {
			t.Errorf("depth %d: packed %v", n, Packed(v))
		}
		if back, err := Unpack(nil, v); err != nil || string(back) != s {
			t.Errorf("depth %d: round trip %v", n, err)
		}
	}
	deep := append([]byte{Tag}, bytes.Repeat([]byte{opArr}, maxDepth+1)...)
	deep = append(deep, bytes.Repeat([]byte{opEnd}, maxDepth+1)...)
	if _, err := Unpack(nil, deep); err == nil || !strings.Contains(err.Error(), "nesting deeper") {
		t.Errorf("Unpack of %d nested arrays: %v", maxDepth+1, err)
	}
}

// TestTimes: every time from year 0 to 9999 that packs unpacks to itself
// (civil against the time package, a day at a time across leap years and
// centuries, and random instants).
func TestTimes(t *testing.T) {
	check := func(tm time.Time, layout string) {
		s := `"` + tm.Format(layout) + `"`
		v := Pack(nil, []byte(s))
		if !Packed(v) || v[1] != opTime {
			t.Fatalf("%s not packed as a time: %x", s, v)
		}
		var d decoder
		d.in, d.pos = v, 1
		if err := d.run(); err != nil || string(d.out) != s {
			t.Fatalf("%s decodes to %s, %v", s, d.out, err)
		}
	}
	for day := time.Date(0, 1, 1, 23, 59, 59, 0, time.UTC); day.Year() < 10000; day = day.AddDate(0, 0, 1) {
		if day.Year() > 3 && day.Year() < 1895 || day.Year() > 2105 && day.Year() < 9996 {
			continue
		}
		check(day, time.RFC3339)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		tm := time.Unix(minSec+r.Int64N(maxSec-minSec), r.Int64N(1e9)).UTC()
		check(tm, time.RFC3339Nano)
		check(tm, "2006-01-02T15:04:05.000000000Z")
	}
}

// TestObjectReader: reading member by member writes what Unpack writes,
// and a method that finds another token consumes nothing.
func TestObjectReader(t *testing.T) {
	var h [32]byte
	h[3] = 9
	v := AppendObject([]byte{Tag})
	v, _ = AppendValue(AppendName(v, "body"), []byte(`{"a":[1,2]}`))
	v = AppendDigest(AppendName(v, "entry_hash"), &h)
	v = AppendString(AppendName(v, "time"), "2026-11-26T14:21:35.859780150Z")
	v = AppendEnd(v)
	want, err := Unpack([]byte("x"), v)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := NewObjectReader([]byte("x"), v)
	if !ok {
		t.Fatal("NewObjectReader refused a packed object")
	}
	var got [32]byte
	steps := []struct {
		name string
		f    func() bool
		ok   bool
	}{
		{"wrong member", func() bool { return r.Member(name(t, "kind")) }, false},
		{"body", func() bool { return r.Member(name(t, "body")) }, true},
		{"digest for an object", func() bool { return r.Digest(&got) }, false},
		{"time for an object", func() bool { return r.Time(9) }, false},
		{"end too early", r.End, false},
		{"body value", r.Value, true},
		{"entry_hash", func() bool { return r.Member(name(t, "entry_hash")) }, true},
		{"digest", func() bool { return r.Digest(&got) }, true},
		{"time", func() bool { return r.Member(name(t, "time")) }, true},
		{"time with 6 digits", func() bool { return r.Time(6) }, false},
		{"time with 9 digits", func() bool { return r.Time(9) }, true},
		{"end", r.End, true},
	}
	for _, s := range steps {
		if s.f() != s.ok {
			t.Fatalf("%s: want %v", s.name, s.ok)
		}
	}
	if string(r.Out()) != string(want) || got != h {
		t.Fatalf("ObjectReader wrote %q (digest %x); Unpack %q", r.Out(), got, want)
	}
	if _, ok := NewObjectReader(nil, Pack(nil, []byte(`[1,2,3,4,5]`))); ok {
		t.Fatal("NewObjectReader accepted an array")
	}
}

func name(t *testing.T, s string) Name {
	n, ok := DictName(s)
	if !ok {
		t.Fatalf("%s is not in the dictionary", s)
	}
	return n
}

// TestCanonicalCheck: the decoder vouches for canonical records of the
// kernel's kinds, and never for text that is not canonical.
func TestCanonicalCheck(t *testing.T) {
	for _, tc := range []struct {
		json  string
		vouch bool
	}{
		{samples[0], true},
		{`{"a":1,"b":[true,null,-5,9007199254740992],"c":{"d":"x y","e":"2026-11-26T14:21:35Z"}}`, true},
		{`{"b":1,"a":2}`, false},                // names out of order
		{`{"a":1,"a":2}`, false},                // duplicate names
		{`{"a":"\n"}`, false},                   // an escape: checked by jcs, canonical
		{`{"é":1}`, false},                      // a non-ASCII name
		{`{"a":9007199254740993}`, false},       // above 2^53
		{`{"a":1.0}`, false},                    // not the shortest form
		{`{"a":1e21}`, false},                   // not ES6 form
		{`{"a":-0}`, false},                     // -0
		{`{"b":{"z":1},"c":{"a":1}}`, true},     // order is per object
		{`{"a":[{"b":1,"c":2},{"b":1}]}`, true}, // names in sibling objects
	} {
		v, ok := AppendValue([]byte{Tag}, []byte(tc.json))
		if !ok {
			t.Fatalf("%s does not pack", tc.json)
		}
		d := decoder{in: v, pos: 1, check: true}
		if err := d.run(); err != nil || string(d.out) != tc.json {
			t.Fatalf("%s: decodes to %s, %v", tc.json, d.out, err)
		}
		if !d.unsure != tc.vouch {
			t.Errorf("%s: vouched %v, want %v", tc.json, !d.unsure, tc.vouch)
		}
	}
}

// FuzzCanonicalCheck: whatever a packed value holds, the decoder vouches
// for its text only when jcs.CheckCanonical accepts that text.
func FuzzCanonicalCheck(f *testing.F) {
	for _, s := range samples {
		f.Add(Pack(nil, []byte(s)))
	}
	f.Add(Pack(nil, []byte(`{"b":1,"a":2}`)))
	f.Add(PackRefs(nil, []byte(refSample)))
	f.Fuzz(func(t *testing.T, v []byte) {
		if !Packed(v) {
			return
		}
		d := decoder{in: v, pos: 1, check: true}
		if err := d.run(); err != nil || d.unsure {
			return
		}
		if err := jcs.CheckCanonical(d.out); err != nil {
			t.Fatalf("vouched for %q (from %x), which is not canonical: %v", d.out, v, err)
		}
	})
}

// TestPlain compares plain, which tests 8 bytes at a time, with
// plainBytes byte by byte, over random strings of up to 40 bytes drawn
// from the bytes at the edges of what it tests.
func TestPlain(t *testing.T) {
	edges := []byte{0x00, 0x1f, 0x20, 0x21, '"', 0x23, 'a', 0x5b, '\\', 0x5d, 0x7e, 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 300_000 {
		b := make([]byte, rng.IntN(41))
		for i := range b {
			b[i] = 'x'
			if rng.IntN(12) == 0 {
				b[i] = edges[rng.IntN(len(edges))]
			}
		}
		want := true
		for _, c := range b {
			want = want && plainBytes[c]
		}
		if got := plain(b); got != want {
			t.Fatalf("plain(%q) = %v, want %v", b, got, want)
		}
	}
}

// TestDictLookup: every dictionary string is found at its index, as a
// string and as bytes; strings that are not in it (empty, longer than any
// entry, an entry with a byte changed or missing) are not.
func TestDictLookup(t *testing.T) {
	for i, s := range dictV1 {
		if b, ok := lookup(s); !ok || int(b) != i {
			t.Errorf("lookup(%q) = %d, %v; want %d", s, b, ok, i)
		}
		if b, ok := lookup([]byte(s)); !ok || int(b) != i {
			t.Errorf("lookup([]byte(%q)) = %d, %v; want %d", s, b, ok, i)
		}
		for _, other := range []string{s[:len(s)-1], s + "x", "X" + s[1:]} {
			if b, ok := lookup(other); ok && dictV1[b] != other {
				t.Errorf("lookup(%q) = %d (%q)", other, b, dictV1[b])
			}
		}
	}
	for _, s := range []string{"", strings.Repeat("a", dictMaxLen+1), "policy_input_shares_argz"} {
		if b, ok := lookup(s); ok {
			t.Errorf("lookup(%q) = %d", s, b)
		}
	}
}

// refSample repeats a path the way an audit payload does.
const refSample = `{"args":{"path":"docs/notes/kernel.md"},"policy_input":{"resources":[{"path":"docs/notes/kernel.md","real_path":"docs/notes/kernel.md"}]},"result":{"path":"docs/notes/kernel.md","short":"f.txt","short2":"f.txt"}}`

// TestPackRefs: PackRefs stores a repeated string of refMin bytes or more
// as a reference (shorter than Pack), shorter ones as text; Pack makes no
// references; both unpack to their input.
func TestPackRefs(t *testing.T) {
	src := []byte(refSample)
	plain, refs := Pack(nil, src), PackRefs(nil, src)
	if n := bytes.Count(refs, []byte{opRef}); n != 3 || bytes.IndexByte(plain, opRef) >= 0 {
		t.Fatalf("PackRefs made %d references (want 3), Pack %d", n, bytes.Count(plain, []byte{opRef}))
	}
	if want := len(plain) - 3*(len("docs/notes/kernel.md")+1-2); len(refs) != want {
		t.Errorf("PackRefs: %d bytes, want %d (Pack: %d)", len(refs), want, len(plain))
	}
	for _, v := range [][]byte{plain, refs} {
		if back, err := Unpack(nil, v); err != nil || string(back) != refSample {
			t.Errorf("Unpack = %q, %v", back, err)
		}
	}
	// Within the budget: a value repeating a long string many times
	// packs to text past it and still round trips.
	many := []byte(`["` + strings.Repeat("x", 200) + `"` + strings.Repeat(`,"`+strings.Repeat("x", 200)+`"`, 20) + `]`)
	v := PackRefs(nil, many)
	if back, err := Unpack(nil, v); err != nil || !bytes.Equal(back, many) {
		t.Fatalf("Unpack(PackRefs(many)) = %.40q, %v", back, err)
	}
	if n := bytes.Count(v, []byte{opRef}); n == 0 || n == 20 {
		t.Errorf("%d of 20 repeats are references; want some, within the budget", n)
	}
}

// refFlood is a value of one 60-byte string and 200 references to it:
// 12,000 bytes of text from ~460, over refBudget.
func refFlood() []byte {
	v := append([]byte{Tag, opArr, opShort + 60}, strings.Repeat("y", 60)...)
	for range 200 {
		v = append(v, opRef, 2)
	}
	return append(v, opEnd)
}

// A Value that fails inside a container consumes nothing: position,
// output and the decoder's open levels are as they were, as ObjectReader
// promises of every method that reports false.
func TestObjectReaderFailedValue(t *testing.T) {
	v := AppendName(AppendObject([]byte{Tag}), "body")
	v, _ = AppendValue(v, []byte(`{"a":[1,[2,3]]}`))
	r, ok := NewObjectReader(nil, v[:len(v)-2]) // the value cut inside its inner array
	if !ok || !r.Member(name(t, "body")) {
		t.Fatal("the object's first member does not read")
	}
	before, out := r.d, len(r.Out())
	if r.Value() {
		t.Fatal("a cut value unpacked")
	}
	if r.d.pos != before.pos || len(r.Out()) != out || r.d.depth != before.depth || r.d.objects != before.objects || r.d.first != before.first {
		t.Fatalf("a failed Value changed the reader: pos %d→%d, depth %d→%d, objects %b→%b", before.pos, r.d.pos, before.depth, r.d.depth, before.objects, r.d.objects)
	}
}

// TestIsHex: isHex agrees with a plain per-byte test on every byte value
// at every position of strings of every length to 40.
func TestIsHex(t *testing.T) {
	plain := func(s []byte) bool {
		for _, c := range s {
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for n := 0; n <= 40; n++ {
		s := bytes.Repeat([]byte("0a9f"), 10)[:n]
		if !isHex(s) {
			t.Fatalf("isHex(%q) = false", s)
		}
		for i := range n {
			for c := range 256 {
				s2 := bytes.Clone(s)
				s2[i] = byte(c)
				if got, want := isHex(s2), plain(s2); got != want {
					t.Fatalf("isHex(%q) = %v, want %v", s2, got, want)
				}
			}
		}
	}
}
