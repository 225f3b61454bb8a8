package kernel

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// forgedLedger writes a ledger of one audit record and one receipt entry
// whose chain, tree and checkpoints are all valid and signed by key, so
// that only the receipt can be wrong; mutate adjusts the receipt before
// signer signs it.
func forgedLedger(t *testing.T, key ed25519.PrivateKey, signer *receipts.Signer, mutate func(*receipts.Receipt, *receiptBody)) *Inspector {
	t.Helper()
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "l.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := auditRecord{OperationID: "op-1", AgentID: "a", ToolID: "echo", ArgsHash: "blake3:" + strings.Repeat("1", 64),
		ResultHash: "blake3:" + strings.Repeat("2", 64), TxOutcome: NoOp, PolicyHash: "blake3:" + strings.Repeat("3", 64),
		AutonomyMode: "autopilot", Status: StatusOK, StartedAt: now.Format(ledger.TimeLayout), RiskBasis: []string{}}
	cs, _ := ledger.NewCheckpointSigner("ck-test", key)
	err = db.Update(func(tx *bbolt.Tx) error {
		if err := ledger.Init(tx); err != nil {
			return err
		}
		ab, _ := json.Marshal(a)
		e, err := ledger.Append(tx, ledger.KindAudit, now, ab)
		if err != nil {
			return err
		}
		r := receipts.Receipt{ReceiptID: "r-1", OperationID: a.OperationID, ToolID: a.ToolID, AgentID: a.AgentID,
			ArgsHash: a.ArgsHash, ResultHash: a.ResultHash, TxOutcome: a.TxOutcome, PolicyHash: a.PolicyHash,
			AutonomyMode: a.AutonomyMode, LedgerSeq: e.Seq, LedgerEntryHash: e.Hash, IssuedAt: now.Format(ledger.TimeLayout)}
		rb := receiptBody{ReceiptID: r.ReceiptID, OperationID: r.OperationID}
		if mutate != nil {
			mutate(&r, &rb)
		}
		if rb.JWS, err = signer.Sign(&r); err != nil {
			return err
		}
		body, _ := json.Marshal(rb)
		if _, err := ledger.Append(tx, ledger.KindReceipt, now, body); err != nil {
			return err
		}
		_, err = ledger.WriteCheckpoint(tx, cs, "ck-test")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return &Inspector{view: db.View, receiptKey: key.Public().(ed25519.PublicKey), origin: "ck-test", close: db.Close}
}

// Verification checks each receipt's signature and its match with the
// audit record it names, and reports the receipt entry (seq 1) otherwise.
func TestVerifyChecksReceipts(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name   string
		signer *receipts.Signer
		mutate func(*receipts.Receipt, *receiptBody)
		reason string // "" = intact
	}{
		{"intact", receipts.NewSigner(key), nil, ""},
		{"signed by another key", receipts.NewSigner(other), nil, "kid"},
		{"args_hash differs from the audit record", receipts.NewSigner(key), func(r *receipts.Receipt, _ *receiptBody) { r.ArgsHash = "blake3:" + strings.Repeat("9", 64) }, "args_hash"},
		{"names an entry that is not an audit record", receipts.NewSigner(key), func(r *receipts.Receipt, _ *receiptBody) { r.LedgerSeq = 7 }, "not a recent earlier audit record"},
		{"entry names another receipt", receipts.NewSigner(key), func(_ *receipts.Receipt, b *receiptBody) { b.ReceiptID = "r-2" }, "entry names receipt r-2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := forgedLedger(t, key, tc.signer, tc.mutate)
			c, err := in.Verify(nil)
			if err != nil {
				t.Fatal(err)
			}
			if tc.reason == "" {
				if !c.Intact || c.Entries != 2 || c.Checkpoints != 1 {
					t.Fatalf("%+v", c)
				}
				return
			}
			if c.Intact || c.BadSeq == nil || *c.BadSeq != 1 || !strings.Contains(c.Reason, tc.reason) {
				t.Fatalf("got %+v, want entry 1 bad with %q", c, tc.reason)
			}
			// The same finding offline, from the export.
			var exp bytes.Buffer
			if err := in.Export(&exp); err != nil {
				t.Fatal(err)
			}
			_, err = VerifyLedgerExport(&exp, "ck-test", key.Public().(ed25519.PublicKey), nil)
			var ve *ledger.VerifyError
			if !errors.As(err, &ve) || ve.Seq != 1 {
				t.Fatalf("export: %v, want entry 1", err)
			}
		})
	}
}

// An export verifies offline with the kernel's id and public key, and
// with no other key or origin.
func TestVerifyLedgerExport(t *testing.T) {
	h := newHarness(t)
	h.burst(16)
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "x", "content": "y"}, key("k")))
	var exp bytes.Buffer
	if err := h.k.Inspector().Export(&exp); err != nil {
		t.Fatal(err)
	}
	var seen []uint64
	rep, err := VerifyLedgerExport(bytes.NewReader(exp.Bytes()), h.k.ID(), h.k.ReceiptKey(), func(s uint64) { seen = append(seen, s) })
	if err != nil {
		t.Fatal(err)
	}
	if rep.Entries != h.headSize() || rep.Checkpoints == 0 || uint64(len(seen)) != rep.Entries || seen[len(seen)-1] != rep.Entries-1 {
		t.Fatalf("report %+v, progress %d calls", rep, len(seen))
	}
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	for name, tc := range map[string]struct {
		origin string
		pub    ed25519.PublicKey
	}{
		"another key":    {h.k.ID(), other.Public().(ed25519.PublicKey)},
		"another origin": {"ck-other", h.k.ReceiptKey()},
	} {
		_, err := VerifyLedgerExport(bytes.NewReader(exp.Bytes()), tc.origin, tc.pub, nil)
		var ce *ledger.CheckpointError
		if !errors.As(err, &ce) {
			t.Fatalf("%s: %v, want a checkpoint error", name, err)
		}
	}
}

// exportLines returns the lines of in's export, each with its newline.
func exportLines(t *testing.T, in *Inspector) [][]byte {
	t.Helper()
	var exp bytes.Buffer
	if err := in.Export(&exp); err != nil {
		t.Fatal(err)
	}
	return slices.Collect(bytes.Lines(exp.Bytes()))
}

// isCheckpointLine reports whether an export line holds a checkpoint.
func isCheckpointLine(line []byte) bool { return bytes.HasPrefix(line, []byte(`{"checkpoint":`)) }

// A ledger is intact only when its latest checkpoint signs every entry:
// entries after it, or entries with no checkpoint, are refused, naming the
// unsigned range, in an export and in a database. An intact ledger reports
// its latest checkpoint.
func TestVerifyUnsignedEntries(t *testing.T) {
	h := newHarness(t)
	h.burst(8)
	mustOK(t, h.invoke("fs.write", map[string]any{"path": "x", "content": "y"}, key("k")))
	n := h.headSize()
	cps := h.checkpoints()
	lines := exportLines(t, h.k.Inspector())

	// Honest: the latest checkpoint is of every entry, and reported.
	for name, verify := range map[string]func() (LedgerCheck, error){
		"database": func() (LedgerCheck, error) { return h.k.Inspector().Verify(nil) },
		"export": func() (LedgerCheck, error) {
			return VerifyExport(bytes.NewReader(bytes.Join(lines, nil)), h.k.ID(), h.k.ReceiptKey(), nil)
		},
	} {
		c, err := verify()
		if err != nil || !c.Intact || c.Latest == nil {
			t.Fatalf("honest %s: %+v %v", name, c, err)
		}
		if want := (CheckpointSummary{Size: n, Root: c.Root, Origin: h.k.ID()}); *c.Latest != want {
			t.Fatalf("honest %s: latest checkpoint %+v, want %+v", name, *c.Latest, want)
		}
	}
	if len(cps) < 3 || cps[len(cps)-2].Size >= n || cps[0].Size != 0 {
		t.Fatalf("checkpoints %+v of a ledger of %d entries", cps, n)
	}
	prev := cps[len(cps)-2].Size
	lastGroup := fmt.Sprintf("entries %d..%d follow the latest checkpoint (size %d): no checkpoint signs them", prev, n-1, prev)
	if n-prev == 1 { // the fs.write call alone
		lastGroup = fmt.Sprintf("entry %d follows the latest checkpoint (size %d): no checkpoint signs it", prev, prev)
	}

	// keep returns the export with only the checkpoint lines keep says.
	keep := func(keep func(i, of int) bool) []byte {
		var out []byte
		i, of := 0, len(cps)
		for _, l := range lines {
			if isCheckpointLine(l) {
				i++
				if !keep(i-1, of) {
					continue
				}
			}
			out = append(out, l...)
		}
		return out
	}
	tests := []struct {
		name   string
		export []byte
		bad    uint64
		reason string
		latest uint64 // its size; 0 with none: no checkpoint
		none   bool
	}{
		{"the last checkpoint dropped", keep(func(i, of int) bool { return i < of-1 }), prev, lastGroup, prev, false},
		{"only the size-0 checkpoint", keep(func(i, _ int) bool { return i == 0 }), 0,
			fmt.Sprintf("entries 0..%d follow the latest checkpoint (size 0): no checkpoint signs them", n-1), 0, false},
		{"no checkpoint", keep(func(int, int) bool { return false }), 0,
			fmt.Sprintf("entries 0..%d but no checkpoint: nothing signs them", n-1), 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := VerifyExport(bytes.NewReader(tc.export), h.k.ID(), h.k.ReceiptKey(), nil)
			if err != nil || c.Intact || c.BadSeq == nil || *c.BadSeq != tc.bad || !strings.Contains(c.Reason, tc.reason) {
				t.Fatalf("got %+v %v, want entry %d bad with %q", c, err, tc.bad, tc.reason)
			}
			if tc.none != (c.Latest == nil) || (c.Latest != nil && c.Latest.Size != tc.latest) {
				t.Fatalf("latest checkpoint %+v, want size %d", c.Latest, tc.latest)
			}
		})
	}

	// Two entries appended to the database after the last checkpoint
	// (whoever holds the file can): the database and its export say so.
	h.k.Close()
	db, err := bbolt.Open(filepath.Join(h.data, DBFile), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		for range 2 {
			if _, err := ledger.Append(tx, ledger.KindPolicyLoaded, time.Now(), json.RawMessage(`{"forged":true}`)); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	in, err := OpenInspector(h.data)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	want := fmt.Sprintf("entries %d..%d follow the latest checkpoint (size %d): no checkpoint signs them", n, n+1, n)
	for name, verify := range map[string]func() (LedgerCheck, error){
		"database": func() (LedgerCheck, error) { return in.Verify(nil) },
		"export": func() (LedgerCheck, error) {
			return VerifyExport(bytes.NewReader(bytes.Join(exportLines(t, in), nil)), h.k.ID(), h.k.ReceiptKey(), nil)
		},
	} {
		c, err := verify()
		if err != nil || c.Intact || c.BadSeq == nil || *c.BadSeq != n || c.Reason != "ledger: "+want || c.Latest == nil || c.Latest.Size != n {
			t.Fatalf("appended, %s: %+v %v, want entry %d bad with %q", name, c, err, n, want)
		}
	}
	// Nor does the kernel open on it: its next group commit would sign
	// the appended entries.
	in.Close()
	if k, err := Open(context.Background(), Config{DataDir: h.data}); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("entries %d..%d were not appended by this kernel", n, n+1)) {
		if k != nil {
			k.Close()
		}
		t.Fatalf("Open on entries beyond the latest checkpoint: %v", err)
	}
}
