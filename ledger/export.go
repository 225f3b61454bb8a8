package ledger

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"runtime/debug"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/jcs"
)

// checkpointLinePrefix starts the export lines that hold checkpoints.
const checkpointLinePrefix = `{"checkpoint":`

// checkpointLine is the JSON object of a checkpoint line.
type checkpointLine struct {
	Checkpoint string `json:"checkpoint"`
}

func marshalCheckpointLine(signed []byte) ([]byte, error) {
	return jcs.Marshal(checkpointLine{string(signed)})
}

// Export writes the ledger in tx to w as JSON lines, an export that
// VerifyExport checks offline with nothing but the checkpoint key. Each
// line ends with "\n" and is one of:
//
//   - an entry: its record, byte for byte (the RFC 8785 canonical JSON of
//     the entry, starting with {"body":, unpacked from its stored form),
//     in sequence order from 0;
//   - a checkpoint: {"checkpoint":"<signed note>"} in RFC 8785 canonical
//     JSON, right after the entry that completes its tree size (a
//     checkpoint of size 0 comes first), in the order of their keys: by
//     the size they are stored under, then by number.
//
// Export copies what is stored without verifying it, so that a
// damaged ledger can still be examined (but a stored record that does not
// unpack, which has no JSON to write, ends the export with an error naming
// it): a checkpoint that cannot be parsed,
// or whose size is below an earlier one's (one stored under another size
// than its own), is written where the walk stands, and checkpoints for
// sizes beyond the entries come last. The numbers the checkpoints are
// stored under are not exported.
func Export(tx *bbolt.Tx, w io.Writer) (err error) {
	var n uint64
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer guardFaults(&err, func() string { return fmt.Sprintf("export after %d entries", n) }) // fault.go
	entries, meta, err := buckets(tx)
	if err != nil {
		return err
	}
	full, err := readsWhole(tx, meta)
	if err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	var ck, cs []byte
	var csize uint64
	var cc *kindCursor
	var cerr error // why the stored value of checkpoint ck does not unpack
	load := func(k, v []byte) {
		ck, csize = k, 0
		cs, cerr = loadCheckpoint(v)
		if k != nil && cerr == nil {
			if c, _, err := parseSigned(cs); err == nil {
				csize = c.Size
			}
		}
	}
	writeCheckpoints := func(all bool) error {
		for ck != nil && (all || csize <= n) {
			if cerr != nil {
				return fmt.Errorf("ledger: export checkpoint %x: %w", ck, cerr)
			}
			line, err := marshalCheckpointLine(cs)
			if err != nil {
				return fmt.Errorf("ledger: export checkpoint %x: %w", ck, err)
			}
			bw.Write(line)
			bw.WriteByte('\n')
			load(cc.Next())
		}
		return nil
	}
	if full {
		cc = newKindCursor(entries, kindCheckpoint)
		load(cc.First())
	}
	c := newKindCursor(entries, kindEntry)
	var rec []byte
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if err := writeCheckpoints(false); err != nil {
			return err
		}
		if rec, err = loadRecord(rec[:0], v); err != nil {
			return fmt.Errorf("ledger: export: entry %x: %w", k, err)
		}
		bw.Write(rec)
		if err := bw.WriteByte('\n'); err != nil {
			return fmt.Errorf("ledger: export: %w", err)
		}
		n++
	}
	if err := writeCheckpoints(true); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("ledger: export: %w", err)
	}
	return nil
}

// VerifyExport verifies an export read from r, with no database: every
// entry record is canonical, well-formed and in sequence from 0, every
// prev_hash links to the entry before and every entry_hash recomputes; the
// Merkle tree is rebuilt as the entries stream by, and every checkpoint
// must stand right after the entries of its size, parse (and, with
// opts.Verifier, carry a valid signature; with opts.Origin, that origin)
// and have the recomputed root at its size; two checkpoints of one size
// with different roots are a *ForkError. Memory stays O(log n).
//
// At the first failure it returns an error naming the line and wrapping a
// *VerifyError (an entry), a *CheckpointError (Num counts the checkpoint
// lines from 0) or a *ForkError; other errors are read errors.
//
// An export says nothing about entries after its last checkpoint, nor
// whether entries were cut off at the end: compare Report.Latest, or a
// checkpoint obtained elsewhere, with what is expected.
func VerifyExport(r io.Reader, opts VerifyOptions) (Report, error) {
	v := newChain(opts)
	v.misplaced = func(size uint64) string {
		return fmt.Sprintf("is for tree size %d but follows %d entries", size, v.n)
	}
	if err := v.run(&exportSource{r: bufio.NewReaderSize(r, 256<<10)}); err != nil {
		return v.report, err
	}
	return v.finish()
}

// exportSource reads the lines of an export.
type exportSource struct {
	r    *bufio.Reader
	line uint64 // lines read
	num  uint64 // checkpoint lines read
	long []byte // a line longer than r's buffer
}

func (s *exportSource) fill(b *batch) (bool, error) {
	for {
		data, err := s.r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			s.long = append(s.long[:0], data...)
			for errors.Is(err, bufio.ErrBufferFull) {
				data, err = s.r.ReadSlice('\n')
				s.long = append(s.long, data...)
			}
			data = s.long
		}
		eof := errors.Is(err, io.EOF)
		if err != nil && !eof {
			return false, fmt.Errorf("ledger: read export line %d: %w", s.line+1, err)
		}
		if eof && len(data) == 0 {
			return false, nil
		}
		s.line++
		it := item{kind: itemEntry, data: bytes.TrimSuffix(data, []byte("\n")), line: s.line}
		if bytes.HasPrefix(it.data, []byte(checkpointLinePrefix)) {
			it.kind, it.num = itemCheckpointLine, s.num
			s.num++
		}
		room := b.add(it)
		if eof {
			return false, nil
		}
		if !room {
			return true, nil
		}
	}
}
