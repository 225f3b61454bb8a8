package ledger

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A checkpoint is stored in the "ledger_checkpoints" bucket packed: its
// signed note rebuilt from binary fields, in about half the bytes of the
// note. What is signed, verified and exported is the note, which
// loadCheckpoint gives back byte for byte; a note stored before packing
// (or one with extension lines, which packing leaves alone) is stored as
// the note itself. docs/formats.md ("Storage encoding") specifies the
// packed form:
//
//	0x01 | uvarint len(origin) | origin | uvarint size | root (32 bytes)
//	     | uvarint signatures | per signature: uvarint len(name) (0: the
//	       origin) | name | uvarint len(sig) | sig
//
// which stands for the note "origin\nsize\n<base64 root>\n\n" followed by
// a line "— name <base64 sig>\n" per signature. A note is text and never
// starts with the byte 0x01.

// checkpointTag starts a packed checkpoint.
const checkpointTag = 0x01

// packCheckpoint returns the stored form of the signed note signed: packed
// when the note has the layout above and unpacks to exactly itself, else
// signed.
func packCheckpoint(signed []byte) []byte {
	text, sigs, ok := strings.Cut(string(signed), "\n\n")
	lines := strings.Split(text, "\n")
	if !ok || len(lines) != 3 || !strings.HasSuffix(sigs, "\n") {
		return signed
	}
	origin := lines[0]
	size, err := strconv.ParseUint(lines[1], 10, 64)
	root, rerr := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || rerr != nil || len(root) != 32 {
		return signed
	}
	out := []byte{checkpointTag}
	out = appendField(out, origin)
	out = binary.AppendUvarint(out, size)
	out = append(out, root...)
	sigLines := strings.Split(strings.TrimSuffix(sigs, "\n"), "\n")
	out = binary.AppendUvarint(out, uint64(len(sigLines)))
	for _, l := range sigLines {
		name, b64, ok := strings.Cut(strings.TrimPrefix(l, "— "), " ")
		sig, err := base64.StdEncoding.DecodeString(b64)
		if !ok || err != nil || !strings.HasPrefix(l, "— ") {
			return signed
		}
		if name == origin {
			name = ""
		}
		out = appendField(out, name)
		out = appendField(out, string(sig))
	}
	if back, err := loadCheckpoint(out); err != nil || !bytes.Equal(back, signed) {
		return signed
	}
	return out
}

func appendField(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

var errCheckpointTruncated = errors.New("undecodable checkpoint: truncated")

// maxNoteSignatures is the most signatures a note may carry (note.Open
// refuses more).
const maxNoteSignatures = 100

// maxUnpackedCheckpoint bounds the note a packed value of n bytes unpacks
// to. A signature whose name is empty stands for the origin, so without a
// bound 2 bytes of a damaged value could stand for a whole origin each (a
// 1 MB value for ~125 GB). Every note the kernel writes unpacks to less
// than twice its packed size, and so does any note of up to three
// signatures under the origin's name or any number under other names.
func maxUnpackedCheckpoint(n int) int { return 4*n + 256 }

// loadCheckpoint returns the signed note of the stored value v: every
// reader of the checkpoint bucket goes through it. A packed value that
// does not decode is an error (damaged or tampered with).
func loadCheckpoint(v []byte) ([]byte, error) {
	if len(v) == 0 || v[0] != checkpointTag {
		return v, nil
	}
	r := v[1:]
	field := func() ([]byte, error) {
		n, k := binary.Uvarint(r)
		if k <= 0 || n > uint64(len(r)-k) {
			return nil, errCheckpointTruncated
		}
		f := r[k : k+int(n)]
		r = r[k+int(n):]
		return f, nil
	}
	origin, err := field()
	if err != nil {
		return nil, err
	}
	size, k := binary.Uvarint(r)
	if k <= 0 || len(r)-k < 32 {
		return nil, errCheckpointTruncated
	}
	root := r[k : k+32]
	r = r[k+32:]
	nsig, k := binary.Uvarint(r)
	if k <= 0 || nsig > uint64(len(r)) {
		return nil, errCheckpointTruncated
	}
	if nsig > maxNoteSignatures {
		return nil, fmt.Errorf("undecodable checkpoint: %d signatures, more than a note holds (%d)", nsig, maxNoteSignatures)
	}
	r = r[k:]
	limit := maxUnpackedCheckpoint(len(v))
	out := make([]byte, 0, 2*len(v)+64)
	out = append(out, origin...)
	out = append(out, '\n')
	out = strconv.AppendUint(out, size, 10)
	out = append(out, '\n')
	out = base64.StdEncoding.AppendEncode(out, root)
	out = append(out, "\n\n"...)
	for range nsig {
		name, err := field()
		if err != nil {
			return nil, err
		}
		sig, err := field()
		if err != nil {
			return nil, err
		}
		if len(name) == 0 {
			name = origin
		}
		if len(out)+len(name)+base64.StdEncoding.EncodedLen(len(sig))+len("— \n ") > limit {
			return nil, fmt.Errorf("undecodable checkpoint: unpacks to more than %d bytes out of %d", limit, len(v))
		}
		out = append(out, "— "...)
		out = append(out, name...)
		out = append(out, ' ')
		out = base64.StdEncoding.AppendEncode(out, sig)
		out = append(out, '\n')
	}
	if len(r) != 0 {
		return nil, errors.New("undecodable checkpoint: bytes after the signatures")
	}
	return out, nil
}
