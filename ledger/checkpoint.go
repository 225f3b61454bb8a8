package ledger

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/digest"
)

// bucketCheckpoints kept every checkpoint written in files of layouts 1
// and 2: key = counter (8 bytes big-endian, from 0), value = the signed
// note (packed). Init moves them into bucketEntries (layoutOneBucket),
// each under checkpointKey(size, counter). Sizes never decrease with the
// counter.
var bucketCheckpoints = []byte("ledger_checkpoints")

// ErrNoCheckpoint is returned (wrapped) by LatestCheckpoint when no
// checkpoint is stored.
var ErrNoCheckpoint = errors.New("ledger: no checkpoint stored")

// Checkpoint is the text of a C2SP tlog-checkpoint
// (https://c2sp.org/tlog-checkpoint): the log's origin, a tree size and the
// Merkle root of the tree of that many entries.
type Checkpoint struct {
	// Origin names the log: non-empty UTF-8 without control characters.
	// capkernel uses the checkpoint key's name.
	Origin string
	// Size is the number of entries the tree covers.
	Size uint64
	// Root is the Merkle root of the first Size entries (Root).
	Root [32]byte
	// Extensions are optional further lines (non-empty, no control
	// characters). capkernel writes none and keeps those it reads.
	Extensions []string
}

// Marshal returns the checkpoint's note text:
//
//	<origin>\n<size in decimal>\n<base64 (standard, padded) of root>\n
//
// followed by one "<extension>\n" per extension line. It does not check the
// fields; SignCheckpoint does.
func (c Checkpoint) Marshal() []byte {
	b := make([]byte, 0, len(c.Origin)+64)
	b = append(b, c.Origin...)
	b = append(b, '\n')
	b = strconv.AppendUint(b, c.Size, 10)
	b = append(b, '\n')
	b = base64.StdEncoding.AppendEncode(b, c.Root[:])
	b = append(b, '\n')
	for _, x := range c.Extensions {
		b = append(b, x...)
		b = append(b, '\n')
	}
	return b
}

// checkLine reports whether s can be a line of a checkpoint: non-empty
// UTF-8 without control characters (which a signed note may not contain).
func checkLine(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q is not UTF-8", what, s)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return fmt.Errorf("%s %q contains a control character", what, s)
		}
	}
	return nil
}

func (c Checkpoint) check() error {
	if err := checkLine("origin", c.Origin); err != nil {
		return err
	}
	for i, x := range c.Extensions {
		if err := checkLine(fmt.Sprintf("extension line %d", i+1), x); err != nil {
			return err
		}
	}
	return nil
}

// ParseCheckpoint parses a checkpoint's note text (without signatures), as
// Marshal writes it. It is strict: the size must be decimal without a sign
// or leading zeros, the root exactly 32 bytes in padded standard base64,
// and every line non-empty and newline-terminated.
func ParseCheckpoint(text []byte) (Checkpoint, error) {
	var c Checkpoint
	s, ok := strings.CutSuffix(string(text), "\n")
	if !ok {
		return c, errors.New("ledger: checkpoint text does not end with a newline")
	}
	lines := strings.Split(s, "\n")
	if len(lines) < 3 {
		return c, fmt.Errorf("ledger: checkpoint text has %d lines, want at least 3 (origin, size, root)", len(lines))
	}
	c.Origin = lines[0]
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || lines[1] != strconv.FormatUint(size, 10) {
		return c, fmt.Errorf("ledger: checkpoint size %q is not a decimal number without leading zeros", lines[1])
	}
	c.Size = size
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || len(root) != len(c.Root) || base64.StdEncoding.EncodeToString(root) != lines[2] {
		return c, fmt.Errorf("ledger: checkpoint root %q is not 32 bytes in padded standard base64", lines[2])
	}
	c.Root = [32]byte(root)
	if len(lines) > 3 {
		c.Extensions = lines[3:]
	}
	if err := c.check(); err != nil {
		return c, fmt.Errorf("ledger: checkpoint: %w", err)
	}
	return c, nil
}

// NewCheckpointSigner returns a note signer that signs with key as the
// Ed25519 note key called name (C2SP signed-note: algorithm byte 0x01; key
// ID = the first 4 bytes of SHA-256(name || "\n" || 0x01 || public key)).
// name must be non-empty UTF-8 without spaces or "+"; by convention it is
// the checkpoint origin.
func NewCheckpointSigner(name string, key ed25519.PrivateKey) (note.Signer, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("ledger: checkpoint signer %q: private key is %d bytes, want %d", name, len(key), ed25519.PrivateKeySize)
	}
	vkey, err := CheckpointVerifierKey(name, key.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	// vkey is "<name>+<key ID in hex>+<base64 public key>"; the signer key
	// is "PRIVATE+KEY+<name>+<key ID>+<base64 (0x01 || seed)>".
	id := vkey[len(name)+1 : len(name)+9]
	s, err := note.NewSigner("PRIVATE+KEY+" + name + "+" + id + "+" +
		base64.StdEncoding.EncodeToString(append([]byte{1}, key.Seed()...)))
	if err != nil {
		return nil, fmt.Errorf("ledger: checkpoint signer %q: %w", name, err)
	}
	return s, nil
}

// CheckpointVerifierKey returns the note verifier key of the Ed25519 public
// key pub called name: "<name>+<key ID, 8 hex digits>+<base64 of 0x01 ||
// pub>", the form note.NewVerifier and other signed-note tools read.
func CheckpointVerifierKey(name string, pub ed25519.PublicKey) (string, error) {
	// The rule of golang.org/x/mod/sumdb/note.
	if name == "" || !utf8.ValidString(name) || strings.IndexFunc(name, unicode.IsSpace) >= 0 || strings.Contains(name, "+") {
		return "", fmt.Errorf("ledger: checkpoint key name %q is not non-empty UTF-8 without spaces or '+'", name)
	}
	vkey, err := note.NewEd25519VerifierKey(name, pub)
	if err != nil {
		return "", fmt.Errorf("ledger: checkpoint key %q: %w", name, err)
	}
	return vkey, nil
}

// NewCheckpointVerifier returns the note verifier of the Ed25519 public key
// pub called name.
func NewCheckpointVerifier(name string, pub ed25519.PublicKey) (note.Verifier, error) {
	vkey, err := CheckpointVerifierKey(name, pub)
	if err != nil {
		return nil, err
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, fmt.Errorf("ledger: checkpoint verifier %q: %w", name, err)
	}
	return v, nil
}

// SignCheckpoint returns c as a signed note: its text (Marshal), a blank
// line and the signature line "— <name> <base64 (key ID || signature)>".
// Ed25519 signatures are deterministic, so equal inputs give equal bytes.
func SignCheckpoint(s note.Signer, c Checkpoint) ([]byte, error) {
	if err := c.check(); err != nil {
		return nil, fmt.Errorf("ledger: sign checkpoint: %w", err)
	}
	signed, err := note.Sign(&note.Note{Text: string(c.Marshal())}, s)
	if err != nil {
		return nil, fmt.Errorf("ledger: sign checkpoint of size %d as %q: %w", c.Size, s.Name(), err)
	}
	return signed, nil
}

// OpenCheckpoint checks that signed is a signed note carrying a valid
// signature by v and returns the checkpoint it holds. Signatures by other
// keys (witness cosignatures, for example) are ignored. The caller must
// still check that the origin is the one it expects. v must not be nil.
func OpenCheckpoint(signed []byte, v note.Verifier) (Checkpoint, error) {
	if v == nil {
		return Checkpoint{}, errors.New("ledger: open checkpoint: no verifier")
	}
	n, err := note.Open(signed, note.VerifierList(v))
	var unverified *note.UnverifiedNoteError
	var invalid *note.InvalidSignatureError
	switch {
	case errors.As(err, &unverified):
		return Checkpoint{}, fmt.Errorf("ledger: checkpoint is not signed by key %s+%08x", v.Name(), v.KeyHash())
	case errors.As(err, &invalid):
		return Checkpoint{}, fmt.Errorf("ledger: checkpoint signature by key %s+%08x does not verify", invalid.Name, invalid.Hash)
	case err != nil:
		return Checkpoint{}, fmt.Errorf("ledger: checkpoint: signed note: %w", err)
	}
	if err := canonicalSigs(n.Sigs, n.UnverifiedSigs); err != nil {
		return Checkpoint{}, err
	}
	return ParseCheckpoint([]byte(n.Text))
}

// canonicalSigs refuses a signature written in base64 that is not the
// canonical encoding of its bytes (unused trailing bits set): note.Open
// decodes it leniently, and one signature would then have many spellings,
// one signed checkpoint many texts.
func canonicalSigs(lists ...[]note.Signature) error {
	for _, sigs := range lists {
		for _, sig := range sigs {
			b, err := base64.StdEncoding.DecodeString(sig.Base64)
			if err != nil || base64.StdEncoding.EncodeToString(b) != sig.Base64 {
				return fmt.Errorf("ledger: checkpoint: the signature by %s is not canonical base64", sig.Name)
			}
		}
	}
	return nil
}

// PeekCheckpoint reads the checkpoint of a signed note without checking
// any signature: to learn its origin (the key name to verify it with) or
// its size before OpenCheckpoint decides whether to trust it.
func PeekCheckpoint(signed []byte) (Checkpoint, error) {
	c, _, err := parseSigned(signed)
	return c, err
}

// parseSigned parses a signed checkpoint without checking any signature.
func parseSigned(signed []byte) (Checkpoint, *note.Note, error) {
	_, err := note.Open(signed, note.VerifierList())
	var unverified *note.UnverifiedNoteError
	if !errors.As(err, &unverified) {
		return Checkpoint{}, nil, fmt.Errorf("ledger: checkpoint: signed note: %w", err)
	}
	if err := canonicalSigs(unverified.Note.UnverifiedSigs); err != nil {
		return Checkpoint{}, nil, err
	}
	c, err := ParseCheckpoint([]byte(unverified.Note.Text))
	return c, unverified.Note, err
}

// StoredCheckpoint is a checkpoint as kept in the ledger.
type StoredCheckpoint struct {
	// Num is the checkpoint's position among the stored checkpoints, from 0.
	Num uint64
	// Checkpoint is parsed from the note text; reading it does not check
	// the signature (Verify does, given a verifier).
	Checkpoint
	// Signed is the signed note (unpacked from its stored form).
	Signed []byte
}

func decodeStored(k, v []byte) (StoredCheckpoint, *note.Note, error) {
	_, num, ok := parseCheckpointKey(k)
	if !ok {
		return StoredCheckpoint{}, nil, fmt.Errorf("ledger: malformed checkpoint key %x", k)
	}
	signed, err := loadCheckpoint(v)
	if err != nil {
		return StoredCheckpoint{}, nil, fmt.Errorf("ledger: checkpoint #%d: %w", num, err)
	}
	c, n, err := parseSigned(signed)
	if err != nil {
		return StoredCheckpoint{}, nil, fmt.Errorf("ledger: checkpoint #%d: %w", num, err)
	}
	return StoredCheckpoint{num, c, bytes.Clone(signed)}, n, nil
}

// LatestCheckpoint returns the checkpoint stored last, or an error wrapping
// ErrNoCheckpoint.
func LatestCheckpoint(tx *bbolt.Tx) (StoredCheckpoint, error) {
	cp, _, err := latest(tx)
	return cp, err
}

func latest(tx *bbolt.Tx) (StoredCheckpoint, *note.Note, error) {
	entries, meta, err := oneBucket(tx)
	if err != nil {
		return StoredCheckpoint{}, nil, err
	}
	k := meta.Get(keyLastCheckpoint)
	if k == nil {
		return StoredCheckpoint{}, nil, ErrNoCheckpoint
	}
	v := entries.Get(k)
	if v == nil {
		return StoredCheckpoint{}, nil, fmt.Errorf("ledger: the latest checkpoint (meta key %q) is recorded under key %x, which holds none (run Verify)", keyLastCheckpoint, k)
	}
	return decodeStored(k, v)
}

// CheckpointAt returns checkpoint #num of tree size size, or an error
// wrapping ErrNoCheckpoint when none is stored under that size and number.
func CheckpointAt(tx *bbolt.Tx, size, num uint64) (StoredCheckpoint, error) {
	entries, _, err := oneBucket(tx)
	if err != nil {
		return StoredCheckpoint{}, err
	}
	k := checkpointKey(size, num)
	v := entries.Get(k)
	if v == nil {
		return StoredCheckpoint{}, fmt.Errorf("%w: #%d of size %d", ErrNoCheckpoint, num, size)
	}
	cp, _, err := decodeStored(k, v)
	return cp, err
}

// Checkpoints calls fn for every stored checkpoint numbered from or higher,
// in order, and stops at the first error, which it returns as is if fn
// returned it. It walks the keys of the whole ledger (checkpoints are
// keyed by size first: see layoutOneBucket); CheckpointAt reads one.
func Checkpoints(tx *bbolt.Tx, from uint64, fn func(StoredCheckpoint) error) error {
	entries, _, err := oneBucket(tx)
	if err != nil {
		return err
	}
	c := newKindCursor(entries, kindCheckpoint)
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if _, num, _ := parseCheckpointKey(k); num < from {
			continue
		}
		cp, _, err := decodeStored(k, v)
		if err != nil {
			return err
		}
		if err := fn(cp); err != nil {
			return err
		}
	}
	return nil
}

// PutCheckpoint stores a signed checkpoint after the others. It checks the
// note's form and that its root is the ledger's root at its size, which
// must be at least the latest stored checkpoint's size and at most the
// number of entries; it does not check the signature.
func PutCheckpoint(tx *bbolt.Tx, signed []byte) (StoredCheckpoint, error) {
	c, _, err := parseSigned(signed)
	if err != nil {
		return StoredCheckpoint{}, err
	}
	return putCheckpoint(tx, c, signed)
}

func putCheckpoint(tx *bbolt.Tx, c Checkpoint, signed []byte) (StoredCheckpoint, error) {
	tree, n, err := treeAt(tx)
	if err != nil {
		return StoredCheckpoint{}, err
	}
	if c.Size > n {
		return StoredCheckpoint{}, fmt.Errorf("ledger: put checkpoint: size %d exceeds the ledger's %d entries", c.Size, n)
	}
	root, err := rootOf(tree, c.Size)
	if err != nil {
		return StoredCheckpoint{}, fmt.Errorf("ledger: put checkpoint: %w", err)
	}
	if root != c.Root {
		return StoredCheckpoint{}, fmt.Errorf("ledger: put checkpoint: root %s for size %d differs from the ledger's %s", digest.Format(c.Root), c.Size, digest.Format(root))
	}
	var num uint64
	last, _, err := latest(tx)
	switch {
	case err == nil:
		if c.Size < last.Size {
			return StoredCheckpoint{}, fmt.Errorf("ledger: put checkpoint: size %d is below the latest checkpoint's %d", c.Size, last.Size)
		}
		num = last.Num + 1
	case !errors.Is(err, ErrNoCheckpoint):
		return StoredCheckpoint{}, fmt.Errorf("ledger: put checkpoint: %w", err)
	}
	if err := storeCheckpoint(tx, c.Size, num, bytes.Clone(signed)); err != nil {
		return StoredCheckpoint{}, err
	}
	return StoredCheckpoint{num, c, bytes.Clone(signed)}, nil
}

// storeCheckpoint stores the signed checkpoint note signed, of tree size
// size, as number num (packed; bbolt holds signed until the transaction
// ends, so it must not change), and records it as the latest.
func storeCheckpoint(tx *bbolt.Tx, size, num uint64, signed []byte) error {
	entries, meta, err := oneBucket(tx)
	if err != nil {
		return err
	}
	entries.FillPercent = 1 // keys only grow: see Writer.AppendCanonical
	k := checkpointKey(size, num)
	if entries.Get(k) != nil {
		// The record of the latest names an earlier one: a checkpoint is
		// never written over.
		return fmt.Errorf("ledger: put checkpoint #%d of size %d: one is stored under its key already (the latest checkpoint's record, meta key %q, is stale: run Verify)", num, size, keyLastCheckpoint)
	}
	if err := entries.Put(k, packCheckpoint(signed)); err != nil {
		return fmt.Errorf("ledger: put checkpoint #%d: %w", num, err)
	}
	if err := meta.Put(keyLastCheckpoint, k); err != nil {
		return fmt.Errorf("ledger: put checkpoint #%d: record it as the latest: %w", num, err)
	}
	return nil
}

// WriteCheckpoint signs a checkpoint of the whole ledger (origin, current
// size, current root) with s and stores it, unless the latest stored
// checkpoint already has this size and origin and is signed by s's key, in
// which case it writes nothing. Either way it returns the latest stored
// checkpoint. Run it at the end of each group-commit transaction.
func WriteCheckpoint(tx *bbolt.Tx, s note.Signer, origin string) (StoredCheckpoint, error) {
	tree, n, err := treeAt(tx)
	if err != nil {
		return StoredCheckpoint{}, err
	}
	last, nt, err := latest(tx)
	switch {
	case err == nil:
		if last.Size == n && last.Origin == origin && signedBy(nt, s) {
			return last, nil
		}
	case !errors.Is(err, ErrNoCheckpoint):
		return StoredCheckpoint{}, fmt.Errorf("ledger: write checkpoint: %w", err)
	}
	root, err := rootOf(tree, n)
	if err != nil {
		return StoredCheckpoint{}, fmt.Errorf("ledger: write checkpoint of size %d: %w", n, err)
	}
	c := Checkpoint{Origin: origin, Size: n, Root: root}
	signed, err := SignCheckpoint(s, c)
	if err != nil {
		return StoredCheckpoint{}, err
	}
	return putCheckpoint(tx, c, signed)
}

// signedBy reports whether n carries a signature line of s's key (without
// checking it: this is the ledger's own stored note).
func signedBy(n *note.Note, s note.Signer) bool {
	for _, sig := range n.UnverifiedSigs {
		if sig.Name == s.Name() && sig.Hash == s.KeyHash() {
			return true
		}
	}
	return false
}
