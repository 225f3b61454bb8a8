package ledger

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zeebo/blake3"
	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/jcs"
)

const merkleVectorsFile = "testdata/merkle_vectors.json"

// merkleVectors is the golden file of the Merkle tree, proofs, checkpoints
// and export: enough for another implementation to check each of them.
// Hashes are "blake3:<hex>" as in every capkernel format.
type merkleVectors struct {
	Comment     string              `json:"comment"`
	EmptyRoot   string              `json:"empty_root"`
	Entries     []merkleVectorEntry `json:"entries"`
	Roots       []vectorRoot        `json:"roots"`
	Inclusion   []vectorInclusion   `json:"inclusion_proofs"`
	Consistency []vectorConsistency `json:"consistency_proofs"`
	Checkpoint  vectorCheckpoint    `json:"checkpoint"`
	Export      []string            `json:"export"` // lines, without their "\n"
}

type merkleVectorEntry struct {
	Seq       uint64 `json:"seq"`
	Record    string `json:"record"`
	EntryHash string `json:"entry_hash"` // also the leaf hash
}

type vectorRoot struct {
	Size uint64 `json:"size"`
	Root string `json:"root"`
}

type vectorInclusion struct {
	Index uint64   `json:"index"`
	Size  uint64   `json:"size"`
	Proof []string `json:"proof"`
}

type vectorConsistency struct {
	Size1 uint64   `json:"size1"`
	Size2 uint64   `json:"size2"`
	Proof []string `json:"proof"`
}

type vectorCheckpoint struct {
	KeySeed     string `json:"key_seed"`   // hex, RFC 8032 §7.1 TEST 1
	PublicKey   string `json:"public_key"` // hex
	KeyName     string `json:"key_name"`
	KeyID       string `json:"key_id"` // hex: SHA-256(key_name || "\n" || 0x01 || public_key)[:4]
	VerifierKey string `json:"verifier_key"`
	Text        string `json:"text"`
	Signed      string `json:"signed"`
}

const vectorEntries = 17

var (
	vectorInclusionCases   = [][2]uint64{{0, 1}, {0, 2}, {1, 2}, {2, 3}, {3, 7}, {0, 8}, {7, 8}, {5, 13}, {12, 13}, {0, 17}, {8, 17}, {16, 17}}
	vectorConsistencyCases = [][2]uint64{{0, 5}, {5, 5}, {1, 2}, {2, 3}, {1, 17}, {3, 7}, {4, 8}, {7, 8}, {6, 13}, {8, 17}, {13, 17}, {16, 17}}
)

func hashStrings(p [][32]byte) []string {
	out := make([]string, len(p))
	for i, h := range p {
		out[i] = digest.Format(h)
	}
	return out
}

func TestMerkleGoldenVectors(t *testing.T) {
	db := newDB(t)
	s := testSigner(t)
	v := merkleVectors{
		Comment: "capkernel ledger v1 Merkle tree (RFC 9162 shape): leaf = entry_hash; node = BLAKE3-keyed(node_key, left||right); " +
			"empty root = BLAKE3-keyed(node_key, no bytes); checkpoints: C2SP tlog-checkpoint, C2SP signed-note Ed25519; export: JSON lines",
		EmptyRoot: digest.Format(emptyRoot),
	}
	base := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := range vectorEntries {
		if err := db.Update(func(tx *bbolt.Tx) error {
			e, err := Append(tx, KindAudit, base.Add(time.Duration(i)*time.Second), json.RawMessage(`{"i":`+strconv.Itoa(i)+`,"tool_id":"echo"}`))
			if err != nil {
				return err
			}
			v.Entries = append(v.Entries, merkleVectorEntry{e.Seq, string(mustRecord(t, tx, e.Seq)), e.Hash})
			if i == 6 {
				_, err = WriteCheckpoint(tx, s, testOrigin)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	cp := writeCheckpoint(t, db, s)
	if err := db.View(func(tx *bbolt.Tx) error {
		for size := range uint64(vectorEntries + 1) {
			r, err := Root(tx, size)
			if err != nil {
				return err
			}
			v.Roots = append(v.Roots, vectorRoot{size, digest.Format(r)})
		}
		for _, c := range vectorInclusionCases {
			p, err := InclusionProof(tx, c[0], c[1])
			if err != nil {
				return err
			}
			v.Inclusion = append(v.Inclusion, vectorInclusion{c[0], c[1], hashStrings(p)})
		}
		for _, c := range vectorConsistencyCases {
			p, err := ConsistencyProof(tx, c[0], c[1])
			if err != nil {
				return err
			}
			v.Consistency = append(v.Consistency, vectorConsistency{c[0], c[1], hashStrings(p)})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pub := testKey(t).Public().(ed25519.PublicKey)
	vkey, err := CheckpointVerifierKey(testOrigin, pub)
	if err != nil {
		t.Fatal(err)
	}
	v.Checkpoint = vectorCheckpoint{
		KeySeed: testSeed, PublicKey: hex.EncodeToString(pub), KeyName: testOrigin,
		KeyID: vkey[len(testOrigin)+1 : len(testOrigin)+9], VerifierKey: vkey,
		Text: string(cp.Marshal()), Signed: string(cp.Signed),
	}
	v.Export = exportLines(t, db)

	checkMerkleVectorsIndependently(t, v)

	var got bytes.Buffer
	enc := json.NewEncoder(&got)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(merkleVectorsFile, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(merkleVectorsFile)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("ledger output differs from %s:\n%s", merkleVectorsFile, got.Bytes())
	}
}

// checkMerkleVectorsIndependently recomputes the vectors from their
// definitions: entry hashes with jcs and plain BLAKE3, roots and proofs with
// the RFC 9162 reference of tree_test.go, the checkpoint with crypto/ed25519
// and SHA-256, and the export with VerifyExport.
func checkMerkleVectorsIndependently(t *testing.T, v merkleVectors) {
	t.Helper()
	var lk [32]byte
	blake3.DeriveKey("capkernel ledger v1 leaf", nil, lk[:])
	var leaves [][32]byte
	for i, e := range v.Entries {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(e.Record), &m); err != nil {
			t.Fatal(err)
		}
		delete(m, "entry_hash")
		pre, err := jcs.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := blake3.NewKeyed(lk[:])
		h.Write(pre)
		leaf := [32]byte(h.Sum(nil))
		if e.EntryHash != digest.Format(leaf) {
			t.Errorf("entry %d: entry_hash %s, want %s", i, e.EntryHash, digest.Format(leaf))
		}
		leaves = append(leaves, leaf)
	}
	if v.EmptyRoot != digest.Format(refRoot(nil)) {
		t.Errorf("empty root %s", v.EmptyRoot)
	}
	for _, r := range v.Roots {
		if want := digest.Format(refRoot(leaves[:r.Size])); r.Root != want {
			t.Errorf("root of size %d: %s, want %s", r.Size, r.Root, want)
		}
	}
	for _, c := range v.Inclusion {
		if want := hashStrings(refPath(int(c.Index), leaves[:c.Size])); strings.Join(c.Proof, " ") != strings.Join(want, " ") {
			t.Errorf("inclusion proof %d in %d: %v, want %v", c.Index, c.Size, c.Proof, want)
		}
	}
	for _, c := range v.Consistency {
		if want := hashStrings(refProof(int(c.Size1), leaves[:c.Size2])); strings.Join(c.Proof, " ") != strings.Join(want, " ") {
			t.Errorf("consistency proof %d to %d: %v, want %v", c.Size1, c.Size2, c.Proof, want)
		}
	}

	seed, _ := hex.DecodeString(v.Checkpoint.KeySeed)
	key := ed25519.NewKeyFromSeed(seed)
	pub := key.Public().(ed25519.PublicKey)
	id := sha256.Sum256(append([]byte(v.Checkpoint.KeyName+"\n\x01"), pub...))
	if v.Checkpoint.KeyID != hex.EncodeToString(id[:4]) || v.Checkpoint.PublicKey != hex.EncodeToString(pub) {
		t.Errorf("checkpoint key: id %s, public key %s", v.Checkpoint.KeyID, v.Checkpoint.PublicKey)
	}
	root := refRoot(leaves)
	text := v.Checkpoint.KeyName + "\n17\n" + base64.StdEncoding.EncodeToString(root[:]) + "\n"
	sig := append(id[:4:4], ed25519.Sign(key, []byte(text))...)
	if signed := text + "\n— " + v.Checkpoint.KeyName + " " + base64.StdEncoding.EncodeToString(sig) + "\n"; v.Checkpoint.Text != text || v.Checkpoint.Signed != signed {
		t.Errorf("checkpoint\n%s\nwant\n%s", v.Checkpoint.Signed, signed)
	}

	verifier, err := NewCheckpointVerifier(v.Checkpoint.KeyName, pub)
	if err != nil {
		t.Fatal(err)
	}
	r, err := VerifyExport(strings.NewReader(strings.Join(v.Export, "\n")+"\n"), VerifyOptions{Verifier: verifier, Origin: v.Checkpoint.KeyName})
	if err != nil || r.Entries != vectorEntries || r.Checkpoints != 2 || r.Root != root {
		t.Errorf("VerifyExport of the vectors' export = %+v, %v", r, err)
	}
	last, err := jcs.Marshal(map[string]string{"checkpoint": v.Checkpoint.Signed})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Export) != vectorEntries+2 || !strings.HasPrefix(v.Export[7], `{"checkpoint":"`+v.Checkpoint.KeyName+`\n7\n`) || v.Export[len(v.Export)-1] != string(last) {
		t.Errorf("export layout: %d lines, line 8 %q, last %q", len(v.Export), v.Export[7], v.Export[len(v.Export)-1])
	}
}
