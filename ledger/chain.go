package ledger

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"unsafe"

	"github.com/zeebo/blake3"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/internal/jsonpack"
)

// chain verifies a stream of entry records and signed checkpoints, each
// checkpoint placed after the entries of its size: the common core of
// VerifyWith and VerifyExport.
//
// The work that depends on one item only (decoding and hashing a record,
// parsing a checkpoint and checking its signature) runs on every core; the
// rest (order, links, the tree, checkpoint roots) runs in order on the
// calling goroutine, which is also the only one that reads the source.
type chain struct {
	opts VerifyOptions
	n    uint64   // entries verified
	prev [32]byte // entry_hash of entry n-1
	tree fold     // the Merkle tree of entries [0, n)
	// nodes, if set, sees every node of the recomputed tree.
	nodes *nodeChecker
	// misplaced explains a checkpoint whose size is not n.
	misplaced func(size uint64) string
	// The checkpoints at size n seen so far: the first one's number and
	// root. Its root is compared with the recomputed one when the next
	// entry arrives or at the end, so that a fork at this size is reported
	// as such whichever of the two comes first.
	pending   bool
	firstNum  uint64
	firstRoot [32]byte

	report Report
}

func newChain(opts VerifyOptions) *chain {
	return &chain{opts: opts, tree: fold{hashes: make([][32]byte, 0, 64), h: keyedHasher(nodeKey)().(*blake3.Hasher)}}
}

// itemKind tells what an item holds.
type itemKind uint8

const (
	itemEntry          itemKind = iota // a stored record
	itemCheckpoint                     // a signed checkpoint note
	itemCheckpointLine                 // an export line {"checkpoint":…}
)

// item is one element of the stream.
type item struct {
	// Set by the source.
	kind itemKind
	data []byte // the record, note or line
	line uint64 // export line number, or 0
	num  uint64 // checkpoint number
	// stored says data is a value of the "ledger" bucket (loadRecord),
	// not a record as exported, key is its key and num its position.
	stored bool
	key    []byte
	err    error // a problem the source found, reported when the item's turn comes

	// Set by prepare.
	e            Entry
	stated, sum  [32]byte // entry_hash as stored and recomputed
	linkedTo     [32]byte // prev_hash
	c            Checkpoint
	prepareError error
}

// batch is a run of items prepared by one worker.
type batch struct {
	items []item
	buf   []byte // storage for the data of items that the source copies
	// unpacked holds the records prepare unpacks from stored values; the
	// worker that prepares the batch owns it.
	unpacked []byte
	done     chan struct{}
}

const (
	batchItems = 512
	batchBytes = 1 << 20
)

// add appends an item whose data is copied into the batch, and reports
// whether the batch has room left. A batch always takes its first item,
// however long.
func (b *batch) add(it item) bool {
	if len(b.buf)+len(it.data) <= cap(b.buf) {
		n := len(b.buf)
		b.buf = append(b.buf, it.data...)
		it.data = b.buf[n:len(b.buf):len(b.buf)]
	} else {
		it.data = append([]byte(nil), it.data...)
	}
	b.items = append(b.items, it)
	return b.room()
}

// put appends an item whose data stays valid while the batch is in use,
// and reports whether the batch has room left.
func (b *batch) put(it item) bool {
	b.items = append(b.items, it)
	return b.room()
}

func (b *batch) room() bool {
	return len(b.items) < batchItems && len(b.buf) < cap(b.buf)
}

// source yields the stream in batches.
type source interface {
	// fill adds items to b until it is full or the stream ends, and
	// reports whether more may follow. An error ends the stream after the
	// items already added.
	fill(b *batch) (more bool, err error)
}

// prepare does the part of an item's verification that needs no other
// item.
//
// An entry is read in place (parseRecord) and hashed without a copy; its
// Entry aliases the item's data (or, for a stored value, the record
// unpacked from it into *unpacked), which stays valid until the item has
// been consumed (OnEntry's Entry is valid only during the call).
func (it *item) prepare(opts *VerifyOptions, unpacked *[]byte, leaf *blake3.Hasher) {
	if it.err != nil {
		return
	}
	switch it.kind {
	case itemEntry:
		if it.stored {
			if len(it.key) != 8 {
				it.err = fmt.Errorf("malformed key %s after entry %d", keyText(it.key), it.num)
				return
			} else if seq := binary.BigEndian.Uint64(it.key); seq != it.num {
				it.err = fmt.Errorf("entry missing (the next stored entry is %d)", seq)
				return
			}
		}
		var r record
		if it.stored && jsonpack.Packed(it.data) {
			// Appending may move *unpacked: the items before keep the
			// old array, which is not written again.
			if out, rec, ok := unpackRecord(&r, *unpacked, it.data); ok {
				*unpacked, it.data = out, rec[:len(rec):len(rec)]
				it.prepared(&r, leaf)
				return
			}
			n := len(*unpacked)
			if *unpacked, it.prepareError = loadRecord(*unpacked, it.data); it.prepareError != nil {
				return
			}
			it.data = (*unpacked)[n:len(*unpacked):len(*unpacked)]
		}
		if it.prepareError = parseRecord(&r, it.data); it.prepareError != nil {
			return
		}
		it.prepared(&r, leaf)
		return
	case itemCheckpointLine:
		if it.prepareError = parseCheckpointLine(it); it.prepareError != nil {
			return
		}
	}
	if opts.Verifier != nil {
		it.c, it.prepareError = OpenCheckpoint(it.data, opts.Verifier)
	} else {
		it.c, _, it.prepareError = parseSigned(it.data)
	}
}

// prepared sets the entry of an item from its parsed record r and hashes
// it with the leaf hasher h.
func (it *item) prepared(r *record, h *blake3.Hasher) {
	it.stated, it.linkedTo = r.hash, r.prev
	it.e = Entry{Seq: r.seq, Kind: alias(r.kind), Time: alias(r.time), PrevHash: alias(r.prevHex), Body: r.body, Hash: alias(r.hashHex)}
	hashRecordWith(h, &it.sum, r, it.data)
}

// alias returns b as a string sharing its memory.
func alias(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// parseCheckpointLine replaces the data of an export line holding a
// checkpoint by the signed note.
func parseCheckpointLine(it *item) error {
	var cl checkpointLine
	if err := json.Unmarshal(it.data, &cl); err != nil {
		return fmt.Errorf("undecodable line: %v", err)
	}
	if want, err := marshalCheckpointLine([]byte(cl.Checkpoint)); err != nil || string(want) != string(it.data) {
		return fmt.Errorf(`line is not exactly {"checkpoint":<string>} in canonical JSON`)
	}
	it.data = []byte(cl.Checkpoint)
	return nil
}

// run verifies the stream of src: workers prepare batches, in order of
// arrival, while this goroutine reads src and consumes the prepared
// batches in order.
func (v *chain) run(src source) error {
	workers := runtime.GOMAXPROCS(0)
	// Buffered, so that this goroutine queues batches and goes on
	// consuming: with an unbuffered channel it waited in each send for a
	// worker to be free, and a worker that finished while it consumed
	// found nothing to do (an idle core on a machine of two).
	work := make(chan *batch, 2*workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			debug.SetPanicOnFault(true) // a damaged page is the item's error (fault.go)
			leaf := keyedHasher(leafKey)().(*blake3.Hasher)
			for b := range work {
				b.unpacked = b.unpacked[:0]
				for i := range b.items {
					b.items[i].prepareGuarded(&v.opts, &b.unpacked, leaf)
				}
				close(b.done)
			}
		}()
	}
	defer func() {
		close(work)
		wg.Wait()
	}()

	var (
		inflight []*batch
		free     []*batch
		srcErr   error
	)
	more := true
	for {
		for more && srcErr == nil && len(inflight) < 2*workers {
			var b *batch
			if n := len(free); n > 0 {
				b, free = free[n-1], free[:n-1]
				b.items, b.buf = b.items[:0], b.buf[:0]
			} else {
				b = &batch{items: make([]item, 0, batchItems), buf: make([]byte, 0, batchBytes)}
			}
			b.done = make(chan struct{})
			more, srcErr = src.fill(b)
			if len(b.items) == 0 {
				free = append(free, b)
				continue
			}
			work <- b
			inflight = append(inflight, b)
		}
		if len(inflight) == 0 {
			return srcErr
		}
		b := inflight[0]
		inflight = inflight[1:]
		<-b.done
		for i := range b.items {
			if err := v.consume(&b.items[i]); err != nil {
				return err
			}
		}
		// The items are not cleared: the next fill sets each one whole,
		// and until then they hold on to memory of this batch only.
		free = append(free, b)
	}
}

// consume verifies a prepared item in its place in the stream.
func (v *chain) consume(it *item) error {
	var err error
	if it.kind == itemEntry {
		err = v.entry(it)
	} else {
		err = v.checkpoint(it)
	}
	if err != nil && it.line > 0 {
		return fmt.Errorf("ledger export line %d: %w", it.line, err)
	}
	return err
}

// entry verifies entry n.
func (v *chain) entry(it *item) error {
	if err := v.settle(); err != nil {
		return err
	}
	n := v.n
	switch {
	case it.err != nil:
		return &VerifyError{Seq: n, Reason: it.err.Error()}
	case it.prepareError != nil:
		return &VerifyError{Seq: n, Reason: it.prepareError.Error()}
	case it.e.Seq != n:
		return &VerifyError{Seq: n, Reason: fmt.Sprintf("record says seq %d", it.e.Seq)}
	case it.linkedTo != v.prev:
		return &VerifyError{Seq: n, Reason: fmt.Sprintf("prev_hash %s is not the entry_hash of the entry before (%s)", it.e.PrevHash, digest.Format(v.prev))}
	case it.stated != it.sum:
		return &VerifyError{Seq: n, Reason: fmt.Sprintf("entry_hash %s does not match the recomputed %s", it.e.Hash, digest.Format(it.sum))}
	}
	if v.opts.OnEntry != nil {
		if err := v.opts.OnEntry(it.e); err != nil {
			return &VerifyError{Seq: n, Reason: err.Error(), Err: err}
		}
	}
	if v.nodes != nil {
		v.tree.append(&it.sum, v.nodes.visit)
		if v.nodes.err != nil {
			return v.nodes.err
		}
	} else {
		v.tree.append(&it.sum, nil)
	}
	v.prev = it.sum
	v.n++
	v.report.Entries = v.n
	return nil
}

// checkpoint verifies a checkpoint that stands after the n entries
// verified so far.
func (v *chain) checkpoint(it *item) error {
	num, c := it.num, it.c
	switch {
	case it.err != nil:
		return &CheckpointError{Num: num, Reason: it.err.Error()}
	case it.prepareError != nil:
		return &CheckpointError{Num: num, Reason: strings.TrimPrefix(it.prepareError.Error(), "ledger: ")}
	case v.opts.Origin != "" && c.Origin != v.opts.Origin:
		return &CheckpointError{Num: num, Reason: fmt.Sprintf("origin %q, want %q", c.Origin, v.opts.Origin)}
	case c.Size != v.n:
		return &CheckpointError{Num: num, Reason: v.misplaced(c.Size)}
	case !v.pending:
		v.pending, v.firstNum, v.firstRoot = true, num, c.Root
	case c.Root != v.firstRoot:
		return &ForkError{Size: c.Size, First: v.firstNum, Second: num, FirstRoot: v.firstRoot, SecondRoot: c.Root}
	}
	v.report.Checkpoints++
	v.report.Latest = c
	return nil
}

// settle compares the root of the checkpoints at size n with the
// recomputed root.
func (v *chain) settle() error {
	if !v.pending {
		return nil
	}
	v.pending = false
	if root := v.tree.root(); root != v.firstRoot {
		return &CheckpointError{Num: v.firstNum, Reason: fmt.Sprintf("root %s for tree size %d differs from the root %s recomputed from the entries",
			digest.Format(v.firstRoot), v.n, digest.Format(root))}
	}
	return nil
}

// finish settles the last checkpoints and completes the report.
func (v *chain) finish() (Report, error) {
	if err := v.settle(); err != nil {
		return v.report, err
	}
	v.report.Root = v.tree.root()
	return v.report, nil
}
