package ledger

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zeebo/blake3"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

const vectorsFile = "testdata/vectors.json"

// vectors is the golden file: enough for another implementation to check
// its key derivation, preimages, entry hashes, stored records and node hash.
type vectors struct {
	Comment        string         `json:"comment"`
	LeafKeyContext string         `json:"leaf_key_context"`
	LeafKey        string         `json:"leaf_key"` // hex
	NodeKeyContext string         `json:"node_key_context"`
	NodeKey        string         `json:"node_key"` // hex
	Entries        []vectorEntry  `json:"entries"`
	Node           vectorNodeHash `json:"node"`
}

type vectorEntry struct {
	Seq       uint64 `json:"seq"`
	Kind      string `json:"kind"`
	Time      string `json:"time"`
	BodyInput string `json:"body_input"` // as handed to Append
	PrevHash  string `json:"prev_hash"`
	Body      string `json:"body"`     // canonical
	Preimage  string `json:"preimage"` // the exact bytes hashed
	EntryHash string `json:"entry_hash"`
	Record    string `json:"record"` // the exact bytes stored
}

type vectorNodeHash struct {
	Left  string `json:"left"`  // hex: entry_hash of entry 0
	Right string `json:"right"` // hex: entry_hash of entry 1
	Hash  string `json:"hash"`  // hex: NodeHash(left, right)
}

var vectorInputs = []struct {
	kind string
	time time.Time
	body string
}{
	{KindPolicyLoaded, time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		`{"bundle":"default","policy_hash":"blake3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"}`},
	{KindTokenSeen, time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC),
		`{"capability_token_id":"0194a0a4-7c00-7000-8000-000000000001","sub":"agent-1"}`},
	{KindAudit, time.Date(2025, 1, 2, 3, 4, 6, 1, time.FixedZone("CET", 3600)),
		`{"agent_id":"agent-1","args":{"path":"notes/r\u00e9sum\u00e9.txt"},"decision":{"autonomy_mode":"autopilot","risk_score":0.25},"tool_id":"fs.write"}`},
	{KindReceipt, time.Date(2025, 1, 2, 3, 4, 6, 2, time.UTC),
		`{"operation_id":"0194a0a4-7c00-7000-8000-000000000002","receipt":"eyJhbGciOiJFZERTQSJ9.e30.c2ln"}`},
	{KindRevocation, time.Date(2025, 1, 2, 3, 4, 7, 999999999, time.UTC),
		"{ \"reason\": \"key \\\"lost\\\"\\n\",\n  \"capability_token_id\": \"0194a0a4-7c00-7000-8000-000000000001\", \"at\": [1, 2.50, 1e3] }"},
}

func TestGoldenVectors(t *testing.T) {
	db := newDB(t)
	v := vectors{
		Comment:        "capkernel ledger v1: entry_hash = BLAKE3-keyed(leaf_key, preimage); node hash = BLAKE3-keyed(node_key, left||right); keys = BLAKE3 derive_key(context, empty material)",
		LeafKeyContext: leafContext,
		LeafKey:        hex.EncodeToString(leafKey[:]),
		NodeKeyContext: nodeContext,
		NodeKey:        hex.EncodeToString(nodeKey[:]),
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		for _, in := range vectorInputs {
			e, err := Append(tx, in.kind, in.time, json.RawMessage(in.body))
			if err != nil {
				return err
			}
			v.Entries = append(v.Entries, vectorEntry{
				Seq: e.Seq, Kind: e.Kind, Time: e.Time, BodyInput: in.body, PrevHash: e.PrevHash,
				Body: string(e.Body), Preimage: string(appendPreimage(nil, &e)), EntryHash: e.Hash,
				Record: string(mustRecord(t, tx, e.Seq)),
			})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	left, _ := digest.Parse(v.Entries[0].EntryHash)
	right, _ := digest.Parse(v.Entries[1].EntryHash)
	node := NodeHash(left, right)
	v.Node = vectorNodeHash{hex.EncodeToString(left[:]), hex.EncodeToString(right[:]), hex.EncodeToString(node[:])}

	checkVectorsIndependently(t, v)

	var got bytes.Buffer
	enc := json.NewEncoder(&got)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.MkdirAll(filepath.Dir(vectorsFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(vectorsFile, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("ledger output differs from %s:\n%s", vectorsFile, got.Bytes())
	}
}

// checkVectorsIndependently recomputes the vectors from their definition,
// with package jcs and plain zeebo/blake3 calls instead of this package's
// code.
func checkVectorsIndependently(t *testing.T, v vectors) {
	t.Helper()
	var lk, nk [32]byte
	blake3.DeriveKey("capkernel ledger v1 leaf", nil, lk[:])
	blake3.DeriveKey("capkernel ledger v1 node", nil, nk[:])
	if v.LeafKey != hex.EncodeToString(lk[:]) || v.NodeKey != hex.EncodeToString(nk[:]) {
		t.Errorf("derived keys differ")
	}
	keyed := func(key [32]byte, b []byte) string {
		h, err := blake3.NewKeyed(key[:])
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
		return hex.EncodeToString(h.Sum(nil))
	}
	prev := ZeroHash
	for i, e := range v.Entries {
		if e.PrevHash != prev {
			t.Errorf("entry %d: prev_hash %s, want %s", i, e.PrevHash, prev)
		}
		pre, err := jcs.Marshal(map[string]any{
			"seq": e.Seq, "kind": e.Kind, "time": e.Time, "prev_hash": e.PrevHash, "body": json.RawMessage(e.BodyInput),
		})
		if err != nil {
			t.Fatal(err)
		}
		if string(pre) != e.Preimage {
			t.Errorf("entry %d: preimage\n%s\nwant (jcs)\n%s", i, e.Preimage, pre)
		}
		if want := digest.Prefix + keyed(lk, pre); e.EntryHash != want {
			t.Errorf("entry %d: entry_hash %s, want %s", i, e.EntryHash, want)
		}
		rec, err := jcs.Marshal(Entry{e.Seq, e.Kind, e.Time, e.PrevHash, json.RawMessage(e.BodyInput), e.EntryHash})
		if err != nil {
			t.Fatal(err)
		}
		if string(rec) != e.Record {
			t.Errorf("entry %d: record\n%s\nwant (jcs)\n%s", i, e.Record, rec)
		}
		prev = e.EntryHash
	}
	l, _ := hex.DecodeString(v.Node.Left)
	r, _ := hex.DecodeString(v.Node.Right)
	if want := keyed(nk, append(l, r...)); v.Node.Hash != want {
		t.Errorf("node hash %s, want %s", v.Node.Hash, want)
	}
}
