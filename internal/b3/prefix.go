package b3

// Prefix is the state of a BLAKE3 keyed hash after a prefix of its input:
// every block of the prefix is compressed but the last, which may be the
// input's last. It is a plain value of a few hundred bytes, so a prefix
// known early is hashed once, off a serial path, and Sum finishes the hash
// of prefix || tail on a copy.
//
// A Prefix keeps at most four chaining values of complete subtrees, which
// covers every input shorter than 31 KiB (the first input that needs a
// fifth spans 31 complete chunks): Write and Sum report false for a longer
// one, and the caller hashes the whole input some other way (Keyed).
type Prefix struct {
	key    Key
	cv     Key    // the chaining value within the current chunk
	chunk  uint64 // the current chunk's index
	blocks int    // blocks of the current chunk compressed
	n      int    // bytes in buf
	buf    [blockLen]byte
	depth  int              // chaining values in stack
	stack  [prefixDepth]Key // of complete subtrees left of the current chunk
	over   bool             // the input outgrew the stack
}

// prefixDepth is how many chaining values of complete subtrees a Prefix
// keeps: after c complete chunks there is one per bit set in c.
const prefixDepth = 4

// PrefixMaxLen is the length of the longest input a Prefix holds: 31
// complete chunks, the last one's last block held back (the first input
// past it needs a fifth chaining value).
const PrefixMaxLen = 31 * chunkLen

// NewPrefix starts a keyed hash under key with no input yet.
func NewPrefix(key *Key) Prefix {
	return Prefix{key: *key, cv: *key}
}

// Write adds b to the input; it reports false once the input is longer
// than a Prefix can hold (then Sum does too).
func (p *Prefix) Write(b []byte) bool {
	for len(b) > 0 && !p.over {
		if p.n == blockLen {
			p.compress() // more input follows: not the last block
			continue
		}
		c := copy(p.buf[p.n:], b)
		p.n += c
		b = b[c:]
	}
	return !p.over
}

// compress compresses the full block in buf, which more input follows.
func (p *Prefix) compress() {
	var block [16]uint32
	load(&block, p.buf[:])
	p.n = 0
	f := uint32(flagKeyedHash)
	if p.blocks == 0 {
		f |= flagChunkStart
	}
	if p.blocks < chunkLen/blockLen-1 {
		p.cv = compressCV(&p.cv, &block, p.chunk, blockLen, f)
		p.blocks++
		return
	}
	// The chunk's last block: its chaining value joins the stack, merged
	// with every subtree it completes (as hash does).
	cv := compressCV(&p.cv, &block, p.chunk, blockLen, f|flagChunkEnd)
	p.chunk++
	for t := p.chunk; t&1 == 0; t >>= 1 {
		p.depth--
		cv = parentCV(&p.key, flagKeyedHash, &p.stack[p.depth], &cv, 0)
	}
	if p.depth == prefixDepth {
		p.over = true
		return
	}
	p.stack[p.depth] = cv
	p.depth++
	p.cv, p.blocks = p.key, 0
}

// Sum returns the keyed hash of the prefix followed by tail, leaving p as
// it was; ok is false when that input is longer than a Prefix holds.
func (p Prefix) Sum(tail []byte) (sum [32]byte, ok bool) {
	if !p.Write(tail) {
		return sum, false
	}
	var last [blockLen]byte
	copy(last[:], p.buf[:p.n])
	var block [16]uint32
	load(&block, last[:])
	f := uint32(flagKeyedHash | flagChunkEnd)
	if p.blocks == 0 {
		f |= flagChunkStart
	}
	var out Key
	if p.depth == 0 {
		out = compressCV(&p.cv, &block, p.chunk, uint32(p.n), f|flagRoot)
	} else {
		out = compressCV(&p.cv, &block, p.chunk, uint32(p.n), f)
		for d := p.depth - 1; d > 0; d-- {
			out = parentCV(&p.key, flagKeyedHash, &p.stack[d], &out, 0)
		}
		out = parentCV(&p.key, flagKeyedHash, &p.stack[0], &out, flagRoot)
	}
	return out.Bytes(), true
}
