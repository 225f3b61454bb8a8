package receipts

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
)

// goldenOrigin is the kernel id of the golden receipt's checkpoint.
const goldenOrigin = "ck-0194a0a4-7c00-7000-8000-000000000000"

// goldenLogged builds the receipt of testdata/logged.json: a ledger of five
// audit entries appended in two group commits (three, then two), each
// ending with a checkpoint signed by the key of testdata/seed.hex, and the
// receipt of entry 3 proven from the second batch's edge in memory.
func goldenLogged(t testing.TB) *Logged {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "l.db"), 0o600, &bbolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	signer, err := ledger.NewCheckpointSigner(goldenOrigin, testKey(t))
	if err != nil {
		t.Fatal(err)
	}
	w := ledger.NewWriter()
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	var out *Logged
	for _, seqs := range [][]int{{0, 1, 2}, {3, 4}} {
		var mine ledger.Appended
		if err := db.Update(func(tx *bbolt.Tx) error {
			if err := ledger.Init(tx); err != nil {
				return err
			}
			for _, i := range seqs {
				body := fmt.Sprintf(`{"agent_id":"agent-1","args_hash":"blake3:%064x","autonomy_mode":"autopilot",`+
					`"capability_token_id":"0194a0a4-7c00-7000-8000-000000000001","operation_id":"0194a0a4-7c00-7000-8000-00000000001%d",`+
					`"policy_hash":"blake3:%064x","result_hash":"blake3:%064x","risk_basis":[],"risk_score":0.25,`+
					`"started_at":"2025-01-02T03:04:05.000000000Z","state_snapshot_id":"","status":"ok","task_class":"","tool_id":"echo","tx_outcome":"no_op"}`,
					i+1, i, 7, 100+i)
				a, err := w.Append(tx, ledger.KindAudit, t0.Add(time.Duration(i)*time.Second), json.RawMessage(body))
				if err != nil {
					return err
				}
				if a.Seq == 3 {
					mine = a
				}
			}
			_, err := w.Checkpoint(tx, signer, goldenOrigin)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if mine.Batch != nil {
			in, err := mine.Batch.Prove(mine.Seq)
			if err != nil {
				t.Fatal(err)
			}
			out = &Logged{Format: Format, Entry: string(mine.Record), Inclusion: in, Checkpoint: string(mine.Batch.Signed)}
		}
	}
	return out
}

func TestLoggedGoldenVector(t *testing.T) {
	got, err := json.MarshalIndent(goldenLogged(t), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, '\n')
	if *update {
		if err := os.WriteFile("testdata/logged.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile("testdata/logged.json")
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("testdata/logged.json differs; got:\n%s", got)
	}
	jwks, err := os.ReadFile("testdata/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	p, err := VerifyLogged(want, jwks)
	if err != nil {
		t.Fatal(err)
	}
	r := p.Receipt
	if r.ReceiptID != ID(3, p.Entry.Hash) || r.LedgerSeq != 3 || r.ToolID != "echo" || r.RiskScore != 0.25 ||
		r.IssuedAt != "2025-01-02T03:04:08.000000006Z" || p.Checkpoint.Size != 5 || p.Checkpoint.Origin != goldenOrigin {
		t.Errorf("verified %+v, checkpoint %+v", r, p.Checkpoint)
	}
}

// Every part of a receipt is bound: a change anywhere is refused.
func TestVerifyLoggedRefuses(t *testing.T) {
	good, err := json.Marshal(goldenLogged(t))
	if err != nil {
		t.Fatal(err)
	}
	key := testKey(t)
	jwks := jwksOf(t, key)
	var base Logged
	if err := json.Unmarshal(good, &base); err != nil {
		t.Fatal(err)
	}
	otherSigner, _ := ledger.NewCheckpointSigner(goldenOrigin, otherKey())
	cp, _ := ledger.PeekCheckpoint([]byte(base.Checkpoint))
	otherSigned, _ := ledger.SignCheckpoint(otherSigner, cp)
	edit := func(f func(l *Logged)) []byte {
		l := base
		l.Inclusion.Proof = append([]string(nil), base.Inclusion.Proof...)
		f(&l)
		b, _ := json.Marshal(l)
		return b
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		jwks []byte
		want string
	}{
		{"another key's JWKS", good, jwksOf(t, otherKey()), "not signed by"},
		{"entry body changed", edit(func(l *Logged) { l.Entry = strings.Replace(l.Entry, `"echo"`, `"fs.rm"`, 1) }), jwks, "entry_hash"},
		{"entry not canonical", edit(func(l *Logged) { l.Entry = strings.Replace(l.Entry, `{"body":{`, `{"body": {`, 1) }), jwks, "canonical"},
		{"checkpoint by another key", edit(func(l *Logged) { l.Checkpoint = string(otherSigned) }), jwks, "not signed by"},
		{"checkpoint size changed", edit(func(l *Logged) { l.Checkpoint = strings.Replace(l.Checkpoint, "\n5\n", "\n6\n", 1) }), jwks, "does not verify"},
		{"proof hash changed", edit(func(l *Logged) { l.Inclusion.Proof[0] = l.Inclusion.LeafHash }), jwks, "inclusion proof"},
		{"proof of another leaf", edit(func(l *Logged) { l.Inclusion.LeafIndex = 2 }), jwks, "entry 2"},
		{"proof for a smaller tree", edit(func(l *Logged) { l.Inclusion.TreeSize = 4 }), jwks, "tree of 4"},
		{"leaf hash changed", edit(func(l *Logged) { l.Inclusion.LeafHash = l.Inclusion.Proof[0] }), jwks, "leaf"},
		{"format v1", edit(func(l *Logged) { l.Format = "capkernel-receipt-bundle/v1" }), jwks, "format"},
		{"unknown member", append(good[:len(good)-1:len(good)-1], []byte(`,"jws":"x"}`)...), jwks, "unknown"},
		{"duplicate member", append([]byte(`{"format":"x",`), good[1:]...), jwks, "duplicate"},
		{"not JSON", []byte("receipt"), jwks, "receipt"},
		// The kernel's key, its x respelled: refused as VerifyJWKS and the
		// console refuse it.
		{"JWKS key's x with unused bits set", good, []byte(`{"keys":[` + respellX(t, jwkOf(t, key), respell) + `]}`), "JWKS key 1: x is not canonical base64url"},
		{"JWKS key's x padded", good, []byte(`{"keys":[` + respellX(t, jwkOf(t, key), func(x string) string { return x + "=" }) + `]}`), "JWKS key 1: x is not unpadded base64url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := VerifyLogged(tc.raw, tc.jwks)
			if err == nil {
				t.Fatalf("VerifyLogged accepted it: %+v", p)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("VerifyLogged = %v; want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestParseID(t *testing.T) {
	h := "blake3:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	id := ID(42, h)
	if id != "r42-0123456789abcdef" {
		t.Fatalf("ID = %q", id)
	}
	if seq, prefix, ok := ParseID(id); !ok || seq != 42 || !strings.HasPrefix(h, prefix) {
		t.Errorf("ParseID(%q) = %d %q %v", id, seq, prefix, ok)
	}
	for _, bad := range []string{"", "r", "r42", "r42-", "r042-0123456789abcdef", "r42-0123456789ABCDEF", "r42-0123456789abcde", "x42-0123456789abcdef",
		"0194a0a4-7c00-7000-8000-000000000003", "r-1-0123456789abcdef", "r18446744073709551616-0123456789abcdef"} {
		if _, _, ok := ParseID(bad); ok {
			t.Errorf("ParseID(%q) accepted it", bad)
		}
	}
}
