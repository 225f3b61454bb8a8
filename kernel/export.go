package kernel

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/jcs"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/strictjson"
)

// An export (Inspector.Export) is ledger.Export's JSON lines with, right
// before the line of each audit record whose payload is kept, a payload
// line: {"payload":<Payload>,"seq":N}. Removing the payload lines
// (grep -v '^{"payload"') leaves the public export, which verifies on its
// own; VerifyExport checks each payload line it finds against the
// commitments of the record that follows it.

// payloadLinePrefix starts every payload line of an export.
var payloadLinePrefix = []byte(`{"payload":`)

// checkpointLinePrefix starts every checkpoint line of an export
// (ledger.Export).
const checkpointLinePrefix = `{"checkpoint":`

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
// its payload lines. Each must be well formed and in its place, or the
// export is not intact, naming the line (checkPayloadLine): strict JSON
// (strictjson: no duplicate or case-variant member, none but payload and
// seq, no unknown member in the payload), in RFC 8785 canonical form,
// right before the line of the record it names, and the only one for that
// record. Each must then open the commitments of that audit record, and
// none may be of an entry that is no audit record with commitments or of
// a record an erasure record names (tampering otherwise, at that seq). It
// reports the records with commitments, the parts opened, those not kept,
// the records erased and the records kept in full, not erased, whose
// payload the export does not carry.
//
// Lines are read whole whatever their length, as ledger.VerifyExport
// reads them: memory grows with the longest line (a payload line holds a
// call's args and result, which the kernel's envelope and result limits
// bound), not with the export.
func VerifyExport(r io.Reader, origin string, pub ed25519.PublicKey, progress func(seq uint64)) (LedgerCheck, error) {
	var mu sync.Mutex
	payloads := map[uint64]*Payload{}
	var present seqSet // records with a payload line: a bit each, not a map entry
	lines := &payloadLines{payload: func(pl *payloadLine) {
		mu.Lock()
		payloads[pl.Seq] = pl.Payload
		mu.Unlock()
	}}
	pr := publicLines(r, lines)
	t := &payloadTally{}
	// The records kept in full without a payload line; an erasure record
	// naming one comes after it, so they are told apart at the end.
	var absent []uint64
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
			switch depth {
			case DepthFull:
				absent = append(absent, e.Seq)
			case DepthCommitmentsOnly:
				// Tallied as the database's check tallies it: its parts
				// were never kept.
				return t.open(e.Seq, c, depth, nil, nil)
			}
			return nil
		}
		present.add(e.Seq)
		return t.open(e.Seq, c, depth, p, nil)
	}
	rep, err := verifyLedgerExport(pr, origin, pub, progress, t.entry, open)
	pr.Close()
	if le := (*payloadLineError)(nil); errors.As(err, &le) {
		return LedgerCheck{Entries: le.entries, BadSeq: le.seq, Reason: le.Error()}, nil
	}
	check, err := CheckOf(rep, err)
	if err != nil || !check.Intact {
		check.Reason = lines.renumber(check.Reason)
		return check, err
	}
	if len(payloads) > 0 {
		seq := slices.Min(slices.Collect(maps.Keys(payloads)))
		return LedgerCheck{Entries: check.Entries, BadSeq: &seq, Reason: fmt.Sprintf("export: a payload line for entry %d, which is no audit record with commitments (tampered)", seq)}, nil
	}
	for seq, erased := range t.erased {
		if erased && present.has(seq) {
			return LedgerCheck{Entries: check.Entries, BadSeq: &seq, Reason: fmt.Sprintf("export: a payload for audit record %d, which an erasure record says was erased (tampered)", seq)}, nil
		}
	}
	for _, seq := range absent {
		if !t.erased[seq] { // an erased record's payload is reported as erased
			t.rep.Absent++
		}
	}
	check.Payloads = &t.rep
	return check, nil
}

// payloadLineError is a payload line that is malformed or out of place.
type payloadLineError struct {
	line    uint64  // its line in the export, from 1
	seq     *uint64 // the entry it names, when it decodes
	entries uint64  // the entry lines before it
	reason  string
}

func (e *payloadLineError) Error() string {
	return fmt.Sprintf("export line %d: %s", e.line, e.reason)
}

// publicLines reads r without its payload lines: the public export, which
// ledger.VerifyExport checks, byte for byte. With pl.payload set, each
// payload line is checked (payloadLines.line) and, if it passes, goes to
// it; the first that fails ends the reading with a *payloadLineError.
// Without, payload lines are skipped unread.
func publicLines(r io.Reader, pl *payloadLines) *io.PipeReader {
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
			if len(data) > 0 {
				public, lerr := pl.line(data)
				if lerr != nil {
					pw.CloseWithError(lerr)
					return
				}
				if public {
					if _, werr := pw.Write(data); werr != nil {
						return
					}
				}
			}
			if err != nil { // io.EOF
				pw.CloseWithError(pl.end())
				return
			}
		}
	}()
	return pr
}

// payloadLines follows the lines of an export to check its payload lines'
// places: each must be followed by the line of the record it names, the
// next entry line (the ledger's verification checks that the entry lines
// hold seq 0, 1, 2, … in order).
type payloadLines struct {
	payload func(*payloadLine) // nil: payload lines are skipped unread
	n       uint64             // lines read
	entries uint64             // entry lines read: the next one is record entries
	pending bool               // the last line was a payload line
	last    uint64             // the seq of the last payload line, if any
	lastAt  uint64             // its line; 0 before the first
	public  uint64             // public lines read

	// shifted lists, in order, the public lines that follow a payload
	// line: ledger.VerifyExport numbers the lines it reads, renumber
	// turns those numbers into the export's.
	mu      sync.Mutex
	shifted []uint64
}

// line takes the next line (its newline included, if it has one) and
// reports whether it is a public line, or why the export is not intact.
func (p *payloadLines) line(data []byte) (public bool, err error) {
	p.n++
	switch {
	case bytes.HasPrefix(data, payloadLinePrefix):
		if p.payload == nil {
			return false, nil
		}
		return false, p.payloadLine(bytes.TrimSuffix(data, []byte("\n")))
	case bytes.HasPrefix(data, []byte(checkpointLinePrefix)):
		if p.pending {
			return false, p.fault(p.lastAt, &p.last, fmt.Sprintf("the payload line for entry %d is followed by a checkpoint line (line %d), not by record %d", p.last, p.n, p.last))
		}
		p.public++
		return true, nil
	}
	if p.pending {
		p.mu.Lock()
		p.shifted = append(p.shifted, p.public+1)
		p.mu.Unlock()
	}
	p.pending = false
	p.entries++
	p.public++
	return true, nil
}

// ledgerLinePrefix starts the error of ledger.VerifyExport that names the
// line at fault, as it numbers the lines it reads.
const ledgerLinePrefix = "ledger export line "

// renumber gives a reason from ledger.VerifyExport the export's line
// number: the ledger reads the export without its payload lines. The
// lines it names were read, and so counted here, before it named them.
func (p *payloadLines) renumber(reason string) string {
	rest, ok := strings.CutPrefix(reason, ledgerLinePrefix)
	num, rest, ok2 := strings.Cut(rest, ":")
	n, err := strconv.ParseUint(num, 10, 64)
	if !ok || !ok2 || err != nil {
		return reason
	}
	p.mu.Lock()
	n += uint64(sort.Search(len(p.shifted), func(i int) bool { return p.shifted[i] > n }))
	p.mu.Unlock()
	return fmt.Sprintf("export line %d:%s", n, rest)
}

// payloadLine checks payload line p.n and hands it on.
func (p *payloadLines) payloadLine(data []byte) error {
	pl, err := checkPayloadLine(data)
	if err != nil && pl != nil {
		return p.fault(p.n, &pl.Seq, err.Error())
	}
	if err != nil {
		return p.fault(p.n, nil, err.Error())
	}
	seq := pl.Seq
	switch {
	case p.lastAt > 0 && seq == p.last:
		return p.fault(p.n, &seq, fmt.Sprintf("a second payload line for entry %d (the first is line %d)", seq, p.lastAt))
	case p.pending:
		return p.fault(p.lastAt, &p.last, fmt.Sprintf("the payload line for entry %d is followed by another payload line (line %d), not by record %d", p.last, p.n, p.last))
	case seq != p.entries:
		return p.fault(p.n, &seq, fmt.Sprintf("the payload line for entry %d stands before record %d, not right before record %d", seq, p.entries, seq))
	}
	p.pending, p.last, p.lastAt = true, seq, p.n
	p.payload(pl)
	return nil
}

// end checks the export's end: its last line must not be a payload line.
func (p *payloadLines) end() error {
	if p.pending {
		return p.fault(p.lastAt, &p.last, fmt.Sprintf("the payload line for entry %d is the export's last line, not followed by record %d", p.last, p.last))
	}
	return nil
}

func (p *payloadLines) fault(line uint64, seq *uint64, reason string) error {
	if seq != nil {
		s := *seq
		seq = &s
	}
	return &payloadLineError{line: line, seq: seq, entries: p.entries, reason: reason}
}

// checkPayloadLine decodes a payload line (without its newline) strictly
// and requires it in canonical form: a line that any other reader could
// read differently (a duplicate or case-variant member, an unknown one)
// or that is not the one form the kernel writes is refused. On a refusal
// the line is returned too if it decoded (its seq names the entry).
func checkPayloadLine(line []byte) (*payloadLine, error) {
	var pl payloadLine
	if err := strictjson.Unmarshal(line, &pl); err != nil {
		return nil, fmt.Errorf("a payload line that does not decode strictly: %w", err)
	}
	if pl.Payload == nil {
		return &pl, fmt.Errorf("the payload line for entry %d holds no payload", pl.Seq)
	}
	if err := jcs.CheckCanonical(line); err != nil {
		return &pl, fmt.Errorf("the payload line for entry %d is not in canonical JSON form (RFC 8785): %w", pl.Seq, err)
	}
	return &pl, nil
}

// seqSet is a set of entry sequence numbers, one bit each: an export's
// verification keeps one per record, and its memory is to grow with the
// longest line, not with the ledger.
type seqSet []uint64

func (s *seqSet) add(seq uint64) {
	i := seq / 64
	if i >= uint64(len(*s)) {
		*s = append(*s, make([]uint64, i+1-uint64(len(*s)))...)
	}
	(*s)[i] |= 1 << (seq % 64)
}

func (s seqSet) has(seq uint64) bool {
	i := seq / 64
	return i < uint64(len(s)) && s[i]&(1<<(seq%64)) != 0
}
