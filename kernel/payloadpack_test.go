package kernel

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/klauspost/compress/huff0"
	"github.com/klauspost/compress/zstd"

	"github.com/capkernel/capkernel/internal/jsonpack"
)

// TestPackPayload: a stored payload is packed, Huffman coded exactly when
// it is from packMin to huffMax bytes packed and coding makes it smaller
// (with the fixed table, or with a table of its own when that is shorter
// and the fixed table saves less than an eighth), a zstd frame from
// huffMax on when the frame is smaller; every stored
// form, and the JSON of payloads stored before packing, reads back to the
// same JSON, and a damaged frame, coded payload or packed value is an
// error, never other bytes.
func TestPackPayload(t *testing.T) {
	// Fixed noise: a few random noises in a hundred pack a few bytes
	// smaller (still unpacking to exactly themselves), and the cases below
	// expect noise that does not.
	r := rand.New(rand.NewPCG(1, 2))
	noise := make([]byte, 2048)
	for i := range noise {
		noise[i] = byte(r.IntN(256))
	}
	const (
		none = iota
		table
		huff
		frame
	)
	for _, tc := range []struct {
		name   string
		json   string
		packed bool
		form   int
	}{
		{"small", `{"salt":"00"}`, true, none},
		{"no text", `{"args":{"path":"f.txt"},"salt":"be3d3b6a23fafb4de18fb41db8609db9221604bd7e0e3bc496243545ce55e0fa"}`, true, none},
		{"text", `{"result":"` + strings.Repeat("a receipt. ", 100) + `"}`, true, table},
		{"one byte repeated", `{"result":"` + strings.Repeat("x", 900) + `"}`, true, huff},
		{"long text", `{"result":"` + strings.Repeat("a receipt. ", 200) + `"}`, true, frame},
		{"short noise", `{"result":"` + string(noise[:800]) + `"}`, false, none}, // neither is smaller
		{"noise", `{"result":"` + string(noise) + `"}`, false, none},
		{"whitespace", `{"result": "` + strings.Repeat("a receipt. ", 100) + `"}`, false, table},
		{"repeated path", `{"args":{"path":"docs/a-long/path.md"},"result":{"path":"docs/a-long/path.md"}}`, true, none},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := packPayload([]byte(tc.json))
			form := none
			inner := v
			switch {
			case bytes.HasPrefix(v, zstdMagic):
				form = frame
				var err error
				if inner, err = unpacker.DecodeAll(v, nil); err != nil {
					t.Fatal(err)
				}
			case v[0] == huffTag || v[0] == tableTag:
				form = huff
				if v[0] == tableTag {
					form = table
				}
				var err error
				if inner, err = huffDecode(nil, v); err != nil {
					t.Fatal(err)
				}
			}
			if form != tc.form {
				t.Fatalf("form %d (%d → %d bytes), want %d", form, len(tc.json), len(v), tc.form)
			}
			if jsonpack.Packed(inner) != tc.packed {
				t.Fatalf("packed: %v, want %v", jsonpack.Packed(inner), tc.packed)
			}
			if len(v) > len(tc.json) {
				t.Fatalf("stored in %d bytes from %d", len(v), len(tc.json))
			}
			for _, stored := range [][]byte{v, []byte(tc.json), jsonpack.Pack(nil, []byte(tc.json))} {
				b, err := unpackPayload(stored)
				if err != nil || string(b) != tc.json {
					t.Fatalf("unpack: %q, %v", b, err)
				}
			}
		})
	}
	v := packPayload([]byte(`{"result":"` + strings.Repeat("abc ", 1000) + `"}`))
	h := packPayload([]byte(`{"result":"` + strings.Repeat("a receipt. ", 100) + `"}`))
	small := packPayload([]byte(`{"args":{"path":"f.txt"},"salt":"00"}`))
	for _, bad := range [][]byte{v[:len(v)/2], append(bytes.Clone(v[:len(v)-1]), v[len(v)-1]^1), h[:len(h)-1], append(bytes.Clone(h), 0), small[:len(small)-1], append(bytes.Clone(small), 0)} {
		if b, err := unpackPayload(bad); err == nil {
			t.Errorf("damaged payload of %d bytes read as %.40q", len(bad), b)
		}
	}
}

// goldenPayload is an fs.read payload; goldenTable is its stored form:
// tableTag, the uvarint length 725 of the packed payload (its path
// stored once and referenced twice), the stream coded with payloadTable;
// goldenHuffman is its form with a table of its own (stored by kernels
// before payloadTable): huffTag, 725, huff0's table and stream.
const goldenPayload = `{"args":{"path":"docs/notes.md"},"policy_input":{"agent_id":"agent-1","resources":[{"kind":"fs","op":"read","path":"docs/notes.md","real_path":"docs/notes.md","root":"/srv/ws"}],"side_effect":"READ","tool_id":"fs.read"},"policy_input_shares_args":true,"result":{"result":{"content":"The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. The kernel answers every call with a receipt; the ledger proves it. ","path":"docs/notes.md"},"status":"ok"},"salt":"be3d3b6a23fafb4de18fb41db8609db9221604bd7e0e3bc496243545ce55e0fa"}`

const goldenHuffman = "02d50536401308007a8fb96f637025c3a864efae06295324e5f3fe38fe523d32913ebdbdd744ab02364950fb67c8f23c38a2996c46c23c1f8b03131a2e34b4b0e0604109160b81102a360c244861c2030a042748bcc0508386820fcbc70acf7830b95060c21102626599f50ecac879a739fa6bbd6cc4ae9e4e5ecb9e11937224ef6ecd3f6dc9f8967ffcc5585966bd833272de698efe5a2f1bb1aba793d7b267c4a41cc9bb5bf34f5b32bee51f7f31569659efa08c9c779aa3bfd6cb46eceae9e4b5ec19312947f2eed6fcd3968c6ff9c75f8c9565d63b2823e79de6e8aff5b211bb7a3a792d7b464cca91bcbb35ffb425e35bfef117636599f50ecac879a739fa6bbd6cc4ae9e4e5ecb9e11937224ef6ecd3f6dc9f8967ffcc5585966bd833272de698efe5a2f1bb1aba793d7b267c4a41cc9bb5bf34f5b32bee51f7f31569659efa08c9c779aa3bfd6cb46eceae9e4b5ec19312947f2eed6fcd3968c6ff9c75f8c9565d63b2823e79de6e8aff5b211bb7a3a792d7b464cca91bcbb35ffb425e35bfef117636599f50ecac879a739fa6bbd6cc4ae9e4e5ecb9e11937224ef6ecd3f6dc9f8967ffcc56cc0705141d221e988b14c3a0ce0f03199e8f370a91e2226708448e00801d940214300898c080d186cbb934408904098342014fd42cd4315d48c00911c900008"

const goldenTable = "03d5052742a4a18131b858a00231c842900378600a016800f5841b347102134b5001952ddc2004059c040151e16b4c71ca2289d3117b1072abe1e7ce44c95d6e08dbedabf5833407f75af977ad21e9dbf6ae9be4ceeca75cd2e4f76d59aee8ab2db9d5f07367a2e42e3784edf6d5fa419a837badfcbbd690f46d7bd74d7267f6532e69f2fbb62c57f4d596dc6af8b9335172971bc276fb6afd20cdc1bd56fe5d6b48fab6bdeb26b933fb299734f97d5b962bfa6a4b6e35fcdc9928b9cb0d61bb7db57e90e6e05e2bffae35247ddbde7593dc99fd944b9afcbe2dcb157db525b71a7eee4c94dce586b0ddbe5a3f487370af957fd71a92be6defba49eecc7eca254d7edf96e58abeda925b0d3f77264aee7243d86e5fad1fa439b8d7cabf6b0d49dfb677dd2477663fe59226bf6fcb72455f6dc9ad869f3b132577b9216cb7afd60fd21cdc6be5dfb586a46fdbbb6e923bb39f724993dfb765b9a2afb6e456c3cf9d8992bbdc10b6db57eb07690eeeb5f2ef5a43d2b7ed5d37c99dd94fb9a4c9efdbb25cd1575b72abe1e7ce44c95d6e08dbedabf5833407f75af977ad21e9dbf6ae9be4ceeca75cd2e4f76d59aee8ab2d09801dd268b9d171a3c34a90134c8e3040a7d3247966e4f444b1e2883d0c39620f42be20f252c4cd952a80fc68ded08b82c4cde7848dacb91dd933af88491172a3c40d1101"

// TestPayloadHuffmanGolden: both golden stored forms read back to their
// payload (what every kernel that wrote them must keep reading), this
// kernel stores the payload in exactly goldenTable's bytes, and codes it
// with a table of its own in exactly goldenHuffman's. A newer huff0 may
// code or build tables otherwise: then a form check fails, and a new
// golden form goes next to the old one, which must still read.
func TestPayloadHuffmanGolden(t *testing.T) {
	table, huff := mustHex(t, goldenTable), mustHex(t, goldenHuffman)
	for _, golden := range [][]byte{table, huff} {
		if b, err := unpackPayload(golden); err != nil || string(b) != goldenPayload {
			t.Fatalf("golden form %.8x… reads as %.60q, %v", golden, b, err)
		}
	}
	if v := packPayload([]byte(goldenPayload)); !bytes.Equal(v, table) {
		t.Errorf("stored form of the golden payload:\n%x\nwant\n%x", v, table)
	}
	if v := ownCode(jsonpack.PackRefs(nil, []byte(goldenPayload))); !bytes.Equal(v, huff) {
		t.Errorf("the golden payload coded with its own table:\n%x\nwant\n%x", v, huff)
	}
}

// TestPayloadTableCodesEveryByte: payloadTable has a code for every byte
// value, so any payload codes with it (when that is shorter) and reads
// back.
func TestPayloadTableCodesEveryByte(t *testing.T) {
	p := []byte(strings.Repeat("the ledger proves it. ", 30))
	for b := range 256 {
		p = append(p, byte(b))
	}
	v := tableCode(p)
	if v == nil || v[0] != tableTag {
		t.Fatalf("coded as %.8x…", v)
	}
	if b, err := huffDecode(nil, v); err != nil || !bytes.Equal(b, p) {
		t.Fatalf("reads back as %.40q, %v", b, err)
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPayloadHuffmanDamaged: a Huffman coded payload (of either form)
// that is cut short, states another length or a length no stream of its
// size holds, has a broken table, or decodes to bytes that are no
// payload is an error; any
// byte changed reads as an error or as other text (which the commitments
// refuse: TestPayloadHuffmanTampered), never a panic. (Like a zstd frame
// without its checksum, the form does not itself detect a changed
// symbol: the payload's commitments do.)
func TestPayloadHuffmanDamaged(t *testing.T) {
	text := bytes.Repeat([]byte("no payload starts like this. "), 30)
	for _, form := range []struct {
		golden   string
		code     func([]byte) []byte
		ownTable bool
	}{
		{goldenTable, tableCode, false},
		{goldenHuffman, ownCode, true},
	} {
		golden := mustHex(t, form.golden)
		tag := golden[0]
		n, k := binary.Uvarint(golden[1:])
		withLen := func(n uint64) []byte {
			return append(binary.AppendUvarint([]byte{tag}, n), golden[1+k:]...)
		}
		notPayload := form.code(text)
		if notPayload == nil {
			t.Fatal("text did not code")
		}
		ofLen := func(n uint64) string { return fmt.Sprintf("Huffman coded payload of %d bytes", len(withLen(n))) }
		cases := []struct {
			name string
			v    []byte
			want string
		}{
			{"tag only", []byte{tag}, "bad length"},
			{"length 0", withLen(0), "bad length"},
			{"length longer than 8 per byte", withLen(8*uint64(len(golden)) + 1), "bad length"},
			{"length over huff0's block", withLen(huff0.BlockSizeMax + 1), "bad length"},
			{"length one more", withLen(n + 1), ofLen(n + 1)},
			{"length one less", withLen(n - 1), ofLen(n - 1)},
			{"not a payload", notPayload, "neither a packed value nor a JSON object"},
		}
		if form.ownTable {
			cases = append(cases, struct {
				name string
				v    []byte
				want string
			}{"broken table", append(bytes.Clone(golden[:1+k]), bytes.Repeat([]byte{0xff}, 100)...), "table"})
		}
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%02x/%s", tag, tc.name), func(t *testing.T) {
				if b, err := unpackPayload(tc.v); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("read as %.40q, %v; want an error with %q", b, err, tc.want)
				}
			})
		}
		for i := 1; i < len(golden); i++ {
			if b, err := unpackPayload(golden[:i]); err == nil {
				t.Errorf("%02x cut to %d bytes: read as %.40q", tag, i, b)
			}
		}
		for i := range golden {
			for _, x := range []byte{0x01, 0x80, 0xff} {
				v := bytes.Clone(golden)
				v[i] ^= x
				unpackPayload(v) // an error, other text or (a padding bit) the same: no panic
			}
		}
	}
}

// TestPayloadHuffmanTampered: a stored Huffman coded payload with a byte
// of its text changed, or cut short, is reported as tampered by
// verification at its seq.
func TestPayloadHuffmanTampered(t *testing.T) {
	h := newHarness(t)
	h.write("f.txt", benchText(t, 1024))
	r := h.invoke("fs.read", map[string]any{"path": "f.txt"})
	mustOK(t, r)
	k := payloadKey(r.LedgerSeq)
	var stored []byte
	h.k.View(func(tx *bbolt.Tx) error {
		stored = bytes.Clone(tx.Bucket(bucketPayloads).Get(k))
		return nil
	})
	if len(stored) == 0 || stored[0] != tableTag {
		t.Fatalf("stored payload %.20x…: not Huffman coded", stored)
	}
	for _, tc := range []struct {
		name string
		v    []byte
	}{
		{"text changed", func() []byte { v := bytes.Clone(stored); v[len(v)/2] ^= 0x01; return v }()},
		{"cut short", stored[:len(stored)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			put := func(v []byte) {
				if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
					return tx.Bucket(bucketPayloads).Put(k, v)
				}); err != nil {
					t.Fatal(err)
				}
			}
			put(tc.v)
			defer put(stored)
			c, err := h.k.Inspector().Verify(nil)
			if err != nil || c.Intact || c.BadSeq == nil || *c.BadSeq != r.LedgerSeq || !strings.Contains(c.Reason, "tampered") {
				t.Fatalf("verify: %+v %v", c, err)
			}
		})
	}
	mustVerify(t, h.k.Inspector())
}

// FuzzUnpackPayload: any stored bytes read as an error or as at most
// packMaxSize bytes, never a panic.
func FuzzUnpackPayload(f *testing.F) {
	for _, g := range []string{goldenTable, goldenHuffman} {
		golden, _ := hex.DecodeString(g)
		f.Add(golden)
	}
	f.Add(packPayload([]byte(`{"result":"` + strings.Repeat("a receipt. ", 200) + `"}`)))
	f.Add(packPayload([]byte(`{"args":{"path":"f.txt"},"salt":"00"}`)))
	f.Add([]byte(`{"salt":"00"}`))
	f.Fuzz(func(t *testing.T, v []byte) {
		if b, err := unpackPayload(v); err == nil && len(b) > packMaxSize {
			t.Fatalf("%d bytes read as %d", len(v), len(b))
		}
	})
}

// BenchmarkPackPayload measures storing the payload of an fs.read of
// 1 KiB of text (packing and compressing it) and reading it back.
func BenchmarkPackPayload(b *testing.B) {
	payload := []byte(`{"args":{"path":"f.txt"},"context":{"risk_basis":["read in scope"]},"policy_input":{"agent_id":"agent-1","resources":[{"exists":true,"kind":"fs","op":"read","path":"f.txt","real_path":"f.txt","root":"/tmp/ws"}],"side_effect":"READ","task_class":"test","tool_id":"fs.read"},"policy_input_shares_args":true,"result":{"result":{"bytes_returned":1024,"content":` +
		strings.TrimSuffix(string(must(canonicalPart(benchText(b, 1024)))), "\n") + `,"offset":0,"path":"f.txt","size":1024,"truncated":false},"status":"ok"},"salt":"be3d3b6a23fafb4de18fb41db8609db9221604bd7e0e3bc496243545ce55e0fa"}`)
	v := packPayload(payload)
	b.Run("pack", func(b *testing.B) {
		for b.Loop() {
			packPayload(payload)
		}
		b.ReportMetric(float64(len(v)), "stored-bytes")
		b.ReportMetric(float64(len(payload)), "json-bytes")
	})
	b.Run("unpack", func(b *testing.B) {
		for b.Loop() {
			if _, err := unpackPayload(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestPayloadFramesOfEveryVersion: a frame with a checksum (as stored
// before packing) of JSON, or of a packed payload, reads.
func TestPayloadFramesOfEveryVersion(t *testing.T) {
	old, _ := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest))
	text := `{"result":"` + strings.Repeat("the kernel answers every call with a receipt. ", 100) + `"}`
	for _, inner := range [][]byte{[]byte(text), jsonpack.Pack(nil, []byte(text))} {
		b, err := unpackPayload(old.EncodeAll(inner, nil))
		if err != nil || string(b) != text {
			t.Fatalf("frame without a dictionary: %.40q, %v", b, err)
		}
	}
}

// TestPayloadPads: the payloads end with the two empty pad keys, which
// verification and retention pass over; a pad that holds a value was put
// there by hand and fails verification.
func TestPayloadPads(t *testing.T) {
	clk := &clock{t: time.Now()}
	h := newHarness(t, func(c *Config) { c.Now = clk.now })
	h.write("f.txt", "text")
	for range 3 {
		mustOK(t, h.invoke("fs.read", map[string]any{"path": "f.txt"}))
	}
	pad := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}
	if err := h.k.View(func(tx *bbolt.Tx) error {
		c := tx.Bucket(bucketPayloads).Cursor()
		k, _ := c.Last()
		k2, _ := c.Prev()
		if !bytes.Equal(k, append(pad[:7:7], 0xff)) || !bytes.Equal(k2, pad) {
			t.Fatalf("last payload keys %x, %x, want the pads", k2, k)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, h.k.Inspector())
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketPayloads).Put(pad, []byte(`{"salt":"00"}`))
	}); err != nil {
		t.Fatal(err)
	}
	if c, err := h.k.Inspector().Verify(nil); err != nil || c.Intact || !strings.Contains(c.Reason, "pad") {
		t.Fatalf("verify with a filled pad: %+v %v", c, err)
	}
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketPayloads).Put(pad, []byte{})
	}); err != nil {
		t.Fatal(err)
	}
	h.k.audit.retention = []retention{{RetentionRule: RetentionRule{OlderThan: "1h"}, age: time.Hour}}
	clk.add(2 * time.Hour)
	if n, err := h.k.Retain(context.Background()); err != nil || n != 3 {
		t.Fatalf("Retain erased %d payloads, %v; want 3", n, err)
	}
	mustVerify(t, h.k.Inspector())
}

// damagePayload rewrites the stored payload of entry seq as edit leaves
// it, well formed: damage only its commitments can tell.
func damagePayload(t *testing.T, h *harness, seq uint64, edit func(*Payload)) {
	t.Helper()
	if err := h.k.db.Update(context.Background(), func(tx *bbolt.Tx) error {
		p, err := getPayload(tx, seq)
		if err != nil || p == nil {
			return fmt.Errorf("payload %v: %v", p, err)
		}
		edit(p)
		b, err := marshalPayload(p)
		if err != nil {
			return err
		}
		return tx.Bucket(bucketPayloads).Put(payloadKey(seq), packPayload(b))
	}); err != nil {
		t.Fatal(err)
	}
}

// TestDamagedPayloadNotServed: a stored payload damaged into other valid
// text (a stored form can decode so) is an error for every reader that
// serves payloads (the auditor's view, the export with payloads), not
// served as the call's: each part must open its commitment.
func TestDamagedPayloadNotServed(t *testing.T) {
	h := newHarness(t)
	h.write("f.txt", "the real text")
	r := h.invoke("fs.read", map[string]any{"path": "f.txt"})
	mustOK(t, r)
	damagePayload(t, h, r.LedgerSeq, func(p *Payload) {
		p.Result = bytes.Replace(p.Result, []byte("the real text"), []byte("a forged text"), 1)
	})
	err := h.k.Inspector().ScanViews(r.LedgerSeq, Access{All: true}, func(v EntryView) error {
		if v.Payload != nil {
			t.Errorf("served the damaged payload: %s", v.Payload.Result)
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "does not open its commitment") {
		t.Fatalf("auditor view: %v", err)
	}
	if err := h.k.db.View(func(tx *bbolt.Tx) error { return exportWithPayloads(tx, io.Discard) }); err == nil || !strings.Contains(err.Error(), "does not open its commitment") {
		t.Fatalf("export with payloads: %v", err)
	}
}

// TestReplayVerifyReportsDamagedPayload: replay verification reports a
// committed call whose stored payload does not open its commitments as a
// problem of that call and goes on; it does not stop with an error.
func TestReplayVerifyReportsDamagedPayload(t *testing.T) {
	h := newHarness(t)
	r := h.invoke("fs.write", map[string]any{"path": "w.txt", "content": "the real text"}, key("k1"))
	mustOK(t, r)
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "v.txt", "content": "other"}, key("k2")))
	damagePayload(t, h, r.LedgerSeq, func(p *Payload) {
		p.Args = bytes.Replace(p.Args, []byte("the real text"), []byte("a forged text"), 1)
	})
	rep, err := h.k.Inspector().ReplayVerify()
	if err != nil {
		t.Fatalf("replay verify stopped: %v", err)
	}
	if len(rep.Problems) != 1 || rep.Problems[0].Key != "k1" || !strings.Contains(rep.Problems[0].Detail, "does not open its commitment") {
		t.Fatalf("problems %+v, want the damaged payload of key k1 (entry %d)", rep.Problems, r.LedgerSeq)
	}
	if rep.Committed != 2 {
		t.Fatalf("%d committed keyed calls, want 2 (the walk went on)", rep.Committed)
	}
}
