package kernel

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
)

// An export (Inspector.Export) is ledger.Export's JSON lines with, right
// before the line of each audit record whose payload is kept, a payload
// line: {"payload":<Payload>,"seq":N}. Removing the payload lines
// (grep -v '^{"payload"') leaves the public export, which verifies on its
// own; VerifyExport checks each payload line it finds against the
// commitments of the record that follows it.

// payloadLinePrefix starts every payload line of an export.
var payloadLinePrefix = []byte(`{"payload":`)

// payloadLine is a payload line of an export.
type payloadLine struct {
	Payload *Payload `json:"payload"`
	Seq     uint64   `json:"seq"`
}

// withPayloads writes ledger lines to w, each audit record preceded by
// its payload line (tx's payloads).
type withPayloads struct {
	w       io.Writer
	tx      *bbolt.Tx
	partial []byte
}

func (x *withPayloads) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			x.partial = append(x.partial, p...)
			return n, nil
		}
		line := p[:i+1]
		if len(x.partial) > 0 {
			line = append(x.partial, line...)
			x.partial = x.partial[:0]
		}
		if err := x.line(line); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
	return n, nil
}

func (x *withPayloads) line(line []byte) error {
	if bytes.HasPrefix(line, []byte(`{"body":`)) {
		var e struct {
			Body struct {
				Commitments
				Depth string `json:"payload_depth"`
			} `json:"body"`
			Seq  uint64 `json:"seq"`
			Kind string `json:"kind"`
		}
		if json.Unmarshal(line, &e) == nil && e.Kind == ledger.KindAudit {
			p, err := openedPayload(x.tx, e.Seq, e.Body.Commitments, e.Body.Depth)
			if err != nil {
				return err
			}
			if p != nil {
				b, err := json.Marshal(payloadLine{Payload: p, Seq: e.Seq})
				if err != nil {
					return err
				}
				if b, err = jcs.Canonicalize(b); err != nil {
					return err
				}
				if _, err := x.w.Write(append(b, '\n')); err != nil {
					return err
				}
			}
		}
	}
	_, err := x.w.Write(line)
	return err
}

// exportWithPayloads writes the export of tx to w (see above).
func exportWithPayloads(tx *bbolt.Tx, w io.Writer) error {
	x := &withPayloads{w: w, tx: tx}
	if err := ledger.Export(tx, x); err != nil {
		return err
	}
	if len(x.partial) > 0 {
		_, err := w.Write(x.partial)
		return err
	}
	return nil
}

// VerifyExport checks an export offline as VerifyLedgerExport does, and
// its payload lines: each must open the commitments of the audit record
// that follows it, and none may be of a record an erasure record names
// (tampering otherwise, at that seq). It reports the records with
// commitments, the parts opened, those not kept, the records erased and
// the records whose payload the export does not carry.
//
// Lines are read whole whatever their length, as ledger.VerifyExport
// reads them: memory grows with the longest line (a payload line holds a
// call's args and result, which the kernel's envelope and result limits
// bound), not with the export.
func VerifyExport(r io.Reader, origin string, pub ed25519.PublicKey, progress func(seq uint64)) (LedgerCheck, error) {
	var mu sync.Mutex
	payloads := map[uint64]*Payload{}
	present := map[uint64]bool{}
	pr := publicLines(r, func(line []byte) error {
		var pl payloadLine
		if err := json.Unmarshal(line, &pl); err != nil || pl.Payload == nil {
			return fmt.Errorf("export: a payload line does not decode: %v", err)
		}
		mu.Lock()
		payloads[pl.Seq] = pl.Payload
		mu.Unlock()
		return nil
	})
	t := &payloadTally{}
	absent := 0
	open := func(e ledger.Entry) error {
		if e.Kind != ledger.KindAudit {
			return nil
		}
		c, depth, err := commitmentsOf(e.Body)
		if err != nil || depth == "" {
			return nil
		}
		mu.Lock()
		p := payloads[e.Seq]
		delete(payloads, e.Seq)
		mu.Unlock()
		if p == nil {
			if depth == DepthFull {
				absent++
			}
			return nil
		}
		present[e.Seq] = true
		return t.open(e.Seq, c, depth, p, nil)
	}
	check, err := CheckOf(verifyLedgerExport(pr, origin, pub, progress, t.entry, open))
	pr.Close()
	if err != nil || !check.Intact {
		return check, err
	}
	for seq := range payloads {
		return LedgerCheck{Entries: check.Entries, BadSeq: &seq, Reason: fmt.Sprintf("export: a payload line for entry %d, which is no audit record with commitments (tampered)", seq)}, nil
	}
	for seq := range present {
		if t.erased[seq] {
			return LedgerCheck{Entries: check.Entries, BadSeq: &seq, Reason: fmt.Sprintf("export: a payload for audit record %d, which an erasure record says was erased (tampered)", seq)}, nil
		}
	}
	t.rep.Absent = absent
	check.Payloads = &t.rep
	return check, nil
}

// publicLines reads r without its payload lines: the public export, which
// ledger.VerifyExport checks, byte for byte. Each payload line goes to
// payload, unless nil; its error ends the reading with that error. Lines
// are read whole whatever their length, as ledger.VerifyExport reads them.
func publicLines(r io.Reader, payload func(line []byte) error) *io.PipeReader {
	pr, pw := io.Pipe()
	go func() {
		br := bufio.NewReaderSize(r, 256<<10)
		var long []byte // a line longer than br's buffer
		for {
			data, err := br.ReadSlice('\n')
			if errors.Is(err, bufio.ErrBufferFull) {
				long = append(long[:0], data...)
				for errors.Is(err, bufio.ErrBufferFull) {
					data, err = br.ReadSlice('\n')
					long = append(long, data...)
				}
				data = long
			}
			if err != nil && !errors.Is(err, io.EOF) {
				pw.CloseWithError(err)
				return
			}
			switch {
			case len(data) == 0: // the end, after a newline
			case !bytes.HasPrefix(data, payloadLinePrefix):
				if _, werr := pw.Write(data); werr != nil {
					return
				}
			case payload != nil:
				if perr := payload(bytes.TrimSuffix(data, []byte("\n"))); perr != nil {
					pw.CloseWithError(perr)
					return
				}
			}
			if err != nil { // io.EOF
				pw.Close()
				return
			}
		}
	}()
	return pr
}
