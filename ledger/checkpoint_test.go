package ledger

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
)

const testOrigin = "capkernel.test/ledger"

// testSeed is the secret key of RFC 8032 §7.1 TEST 1, whose public key is
// d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a.
const testSeed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"

func testKey(tb testing.TB) ed25519.PrivateKey {
	tb.Helper()
	seed, err := hex.DecodeString(testSeed)
	if err != nil {
		tb.Fatal(err)
	}
	return ed25519.NewKeyFromSeed(seed)
}

func testSigner(tb testing.TB) note.Signer {
	tb.Helper()
	s, err := NewCheckpointSigner(testOrigin, testKey(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func testVerifier(tb testing.TB) note.Verifier {
	tb.Helper()
	v, err := NewCheckpointVerifier(testOrigin, testKey(tb).Public().(ed25519.PublicKey))
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// otherSigner signs under the test origin with another key.
func otherSigner(tb testing.TB) note.Signer {
	tb.Helper()
	s, err := NewCheckpointSigner(testOrigin, ed25519.NewKeyFromSeed(make([]byte, 32)))
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func writeCheckpoint(tb testing.TB, db *bbolt.DB, s note.Signer) StoredCheckpoint {
	tb.Helper()
	var cp StoredCheckpoint
	if err := db.Update(func(tx *bbolt.Tx) (err error) {
		cp, err = WriteCheckpoint(tx, s, testOrigin)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return cp
}

func rootAt(tb testing.TB, db *bbolt.DB, size uint64) (r [32]byte) {
	tb.Helper()
	if err := db.View(func(tx *bbolt.Tx) (err error) {
		r, err = Root(tx, size)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	return r
}

func mustSign(tb testing.TB, s note.Signer, c Checkpoint) []byte {
	tb.Helper()
	signed, err := SignCheckpoint(s, c)
	if err != nil {
		tb.Fatal(err)
	}
	return signed
}

func TestCheckpointTextRoundTrip(t *testing.T) {
	root := [32]byte{0: 0xfb, 31: 0xff}
	for _, c := range []Checkpoint{
		{Origin: testOrigin, Size: 0, Root: emptyRoot},
		{Origin: "example.com/behind-the-sofa", Size: 20852163, Root: root},
		{Origin: "a", Size: 1<<64 - 1, Root: root, Extensions: []string{"ext one", "— two"}},
	} {
		text := c.Marshal()
		want := fmt.Sprintf("%s\n%d\n%s\n", c.Origin, c.Size, base64.StdEncoding.EncodeToString(c.Root[:]))
		for _, x := range c.Extensions {
			want += x + "\n"
		}
		if string(text) != want {
			t.Errorf("Marshal = %q, want %q", text, want)
		}
		got, err := ParseCheckpoint(text)
		if err != nil {
			t.Errorf("ParseCheckpoint(%q): %v", text, err)
			continue
		}
		if got.Origin != c.Origin || got.Size != c.Size || got.Root != c.Root || strings.Join(got.Extensions, "|") != strings.Join(c.Extensions, "|") {
			t.Errorf("ParseCheckpoint(%q) = %+v, want %+v", text, got, c)
		}
	}
}

func TestParseCheckpointRejects(t *testing.T) {
	r := base64.StdEncoding.EncodeToString(make([]byte, 32))
	for _, tc := range []struct{ text, want string }{
		{"o\n5\n" + r, "does not end with a newline"},
		{"o\n5\n", "has 2 lines"},
		{"\n5\n" + r + "\n", "origin is empty"},
		{"o\x01x\n5\n" + r + "\n", "control character"},
		{"o\n05\n" + r + "\n", `size "05"`},
		{"o\n+5\n" + r + "\n", `size "+5"`},
		{"o\n-1\n" + r + "\n", `size "-1"`},
		{"o\n18446744073709551616\n" + r + "\n", "size"},
		{"o\n\n" + r + "\n", `size ""`},
		{"o\n5\n" + r[:len(r)-1] + "\n", "not 32 bytes"},
		{"o\n5\n" + base64.StdEncoding.EncodeToString(make([]byte, 31)) + "\n", "not 32 bytes"},
		{"o\n5\n" + base64.RawStdEncoding.EncodeToString(make([]byte, 32)) + "\n", "not 32 bytes"},
		{"o\n5\n" + strings.ReplaceAll(r, "A", "-") + "\n", "not 32 bytes"},
		{"o\n5\n" + r + "\n\n", "extension line 1 is empty"},
		{"o\n5\n" + r + "\next\n\n", "extension line 2 is empty"},
	} {
		if _, err := ParseCheckpoint([]byte(tc.text)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseCheckpoint(%q) = %v, want %q", tc.text, err, tc.want)
		}
	}
}

// TestCheckpointSignature checks the signed note byte for byte against the
// C2SP signed-note definition, computed with crypto/ed25519 and SHA-256.
func TestCheckpointSignature(t *testing.T) {
	key := testKey(t)
	pub := key.Public().(ed25519.PublicKey)
	if hex.EncodeToString(pub) != "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a" {
		t.Fatalf("public key %x", pub)
	}
	keyID := sha256.Sum256(append([]byte(testOrigin+"\n\x01"), pub...))
	vkey := fmt.Sprintf("%s+%x+%s", testOrigin, keyID[:4], base64.StdEncoding.EncodeToString(append([]byte{1}, pub...)))
	if got, err := CheckpointVerifierKey(testOrigin, pub); got != vkey || err != nil {
		t.Errorf("CheckpointVerifierKey = %q, %v; want %q", got, err, vkey)
	}
	s := testSigner(t)
	if s.Name() != testOrigin || s.KeyHash() != binary.BigEndian.Uint32(keyID[:4]) {
		t.Errorf("signer %s+%08x, want %s+%x", s.Name(), s.KeyHash(), testOrigin, keyID[:4])
	}

	c := Checkpoint{Origin: testOrigin, Size: 42, Root: [32]byte{1, 2, 3}}
	signed := mustSign(t, s, c)
	text := c.Marshal()
	sig := append(keyID[:4:4], ed25519.Sign(key, text)...)
	want := string(text) + "\n— " + testOrigin + " " + base64.StdEncoding.EncodeToString(sig) + "\n"
	if string(signed) != want {
		t.Fatalf("signed checkpoint\n%s\nwant\n%s", signed, want)
	}

	v, err := note.NewVerifier(vkey)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenCheckpoint(signed, v)
	if err != nil || got.Size != 42 || got.Root != c.Root || got.Origin != testOrigin {
		t.Errorf("OpenCheckpoint = %+v, %v", got, err)
	}

	// A witness cosignature by an unknown key is ignored.
	witness, err := NewCheckpointSigner("witness.example", ed25519.NewKeyFromSeed(make([]byte, 32)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := note.Open(signed, note.VerifierList(v))
	if err != nil {
		t.Fatal(err)
	}
	cosigned, err := note.Sign(n, witness)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCheckpoint(cosigned, v); err != nil {
		t.Errorf("OpenCheckpoint of a cosigned checkpoint: %v", err)
	}

	other := mustSign(t, otherSigner(t), c)
	tamperedText := bytes.Replace(signed, []byte("\n42\n"), []byte("\n43\n"), 1)
	tamperedSig := bytes.Clone(signed)
	tamperedSig[len(tamperedSig)-5] ^= 1
	for _, tc := range []struct {
		name   string
		signed []byte
		want   string
	}{
		{"signed by another key", other, "not signed by key " + testOrigin + "+" + hex.EncodeToString(keyID[:4])},
		{"text changed", tamperedText, "does not verify"},
		{"signature changed", tamperedSig, "does not verify"},
		{"no signature", text, "malformed note"},
		{"text only with a blank line", append(bytes.Clone(text), '\n'), "malformed note"},
	} {
		if _, err := OpenCheckpoint(tc.signed, v); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: OpenCheckpoint = %v, want %q", tc.name, err, tc.want)
		}
	}

	// Malformed checkpoints are refused before signing.
	if _, err := SignCheckpoint(s, Checkpoint{Origin: "two\nlines"}); err == nil || !strings.Contains(err.Error(), "control character") {
		t.Errorf("SignCheckpoint with a newline in the origin: %v", err)
	}
}

func TestCheckpointKeysRejected(t *testing.T) {
	key := testKey(t)
	for _, name := range []string{"", "a+b", "a b", "a\tb", "a\u00a0b", "a\xffb"} {
		if _, err := NewCheckpointSigner(name, key); err == nil {
			t.Errorf("NewCheckpointSigner(%q) accepted", name)
		}
		if _, err := NewCheckpointVerifier(name, key.Public().(ed25519.PublicKey)); err == nil {
			t.Errorf("NewCheckpointVerifier(%q) accepted", name)
		}
	}
	if _, err := NewCheckpointSigner("ok", key[:32]); err == nil || !strings.Contains(err.Error(), "private key is 32 bytes") {
		t.Errorf("NewCheckpointSigner with a short key: %v", err)
	}
	if _, err := OpenCheckpoint([]byte("x"), nil); err == nil || !strings.Contains(err.Error(), "no verifier") {
		t.Errorf("OpenCheckpoint without a verifier: %v", err)
	}
	if _, err := NewCheckpointVerifier("ok", make([]byte, 31)); err == nil {
		t.Error("NewCheckpointVerifier with a short key accepted")
	}
	broken := bytes.Clone(key)
	broken[40] ^= 1 // public half no longer matches the seed
	if _, err := NewCheckpointSigner("ok", broken); err == nil {
		t.Error("NewCheckpointSigner with an inconsistent key accepted")
	}
}

func TestWriteCheckpoint(t *testing.T) {
	db := newDB(t)
	if err := db.View(func(tx *bbolt.Tx) error {
		_, err := LatestCheckpoint(tx)
		if !errors.Is(err, ErrNoCheckpoint) {
			t.Errorf("LatestCheckpoint of a new ledger: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	other := ed25519.NewKeyFromSeed(make([]byte, 32))
	steps := []struct {
		name    string
		before  func()
		key     ed25519.PrivateKey
		origin  string
		wantNum uint64
		size    uint64
	}{
		{"empty ledger", nil, testKey(t), testOrigin, 0, 0},
		{"nothing new", nil, testKey(t), testOrigin, 0, 0},
		{"after appends", func() { appendBatch(t, db, 3) }, testKey(t), testOrigin, 1, 3},
		{"again nothing new", nil, testKey(t), testOrigin, 1, 3},
		{"another origin", nil, testKey(t), "capkernel.test/other", 2, 3},
		{"another key", nil, other, "capkernel.test/other", 3, 3},
		{"after one more", func() { appendBatch(t, db, 1) }, testKey(t), testOrigin, 4, 4},
	}
	for _, st := range steps {
		if st.before != nil {
			st.before()
		}
		signer, err := NewCheckpointSigner(testOrigin, st.key)
		if err != nil {
			t.Fatal(err)
		}
		verifier, err := NewCheckpointVerifier(testOrigin, st.key.Public().(ed25519.PublicKey))
		if err != nil {
			t.Fatal(err)
		}
		var cp StoredCheckpoint
		if err := db.Update(func(tx *bbolt.Tx) (err error) {
			cp, err = WriteCheckpoint(tx, signer, st.origin)
			return err
		}); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if cp.Num != st.wantNum || cp.Size != st.size || cp.Origin != st.origin || cp.Root != rootAt(t, db, st.size) {
			t.Errorf("%s: WriteCheckpoint = #%d size %d origin %s, want #%d size %d origin %s", st.name, cp.Num, cp.Size, cp.Origin, st.wantNum, st.size, st.origin)
		}
		if _, err := OpenCheckpoint(cp.Signed, verifier); err != nil {
			t.Errorf("%s: %v", st.name, err)
		}
	}
	if err := db.View(func(tx *bbolt.Tx) error {
		latest, err := LatestCheckpoint(tx)
		if err != nil || latest.Num != 4 || latest.Size != 4 {
			t.Errorf("LatestCheckpoint = #%d size %d, %v", latest.Num, latest.Size, err)
		}
		var nums []uint64
		if err := Checkpoints(tx, 2, func(c StoredCheckpoint) error { nums = append(nums, c.Num); return nil }); err != nil {
			return err
		}
		if fmt.Sprint(nums) != "[2 3 4]" {
			t.Errorf("Checkpoints from 2: %v", nums)
		}
		stop := errors.New("stop")
		if err := Checkpoints(tx, 0, func(StoredCheckpoint) error { return stop }); err != stop {
			t.Errorf("Checkpoints did not return fn's error as is: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := verifyDBWith(db, VerifyOptions{}); err != nil || r.Checkpoints != 5 || r.Entries != 4 {
		t.Errorf("Verify = %+v, %v", r, err)
	}
}

func verifyDBWith(db *bbolt.DB, opts VerifyOptions) (r Report, err error) {
	err = db.View(func(tx *bbolt.Tx) error {
		r, err = VerifyWith(tx, opts)
		return err
	})
	return r, err
}

func TestPutCheckpointRejects(t *testing.T) {
	db := newDB(t)
	s := testSigner(t)
	appendBatch(t, db, 5)
	writeCheckpoint(t, db, s)
	r3 := rootAt(t, db, 3)
	for _, tc := range []struct {
		name   string
		signed []byte
		want   string
	}{
		{"wrong root", mustSign(t, s, Checkpoint{Origin: testOrigin, Size: 5, Root: r3}), "root blake3:" + hex.EncodeToString(r3[:]) + " for size 5 differs from the ledger's"},
		{"beyond the entries", mustSign(t, s, Checkpoint{Origin: testOrigin, Size: 6}), "size 6 exceeds the ledger's 5 entries"},
		{"below the latest", mustSign(t, s, Checkpoint{Origin: testOrigin, Size: 3, Root: r3}), "size 3 is below the latest checkpoint's 5"},
		{"unsigned", Checkpoint{Origin: testOrigin, Size: 5}.Marshal(), "malformed note"},
		{"not a checkpoint", []byte("hello\n\n— " + testOrigin + " AAAAAAAA\n"), "has 1 lines"},
	} {
		if err := db.Update(func(tx *bbolt.Tx) error {
			_, err := PutCheckpoint(tx, tc.signed)
			return err
		}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: PutCheckpoint = %v, want %q", tc.name, err, tc.want)
		}
	}
	// Another signature of the latest size is accepted.
	if err := db.Update(func(tx *bbolt.Tx) error {
		cp, err := PutCheckpoint(tx, mustSign(t, otherSigner(t), Checkpoint{Origin: testOrigin, Size: 5, Root: rootAt(t, db, 5)}))
		if err == nil && cp.Num != 1 {
			t.Errorf("PutCheckpoint stored #%d, want #1", cp.Num)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
}

// TestVerifyChecksCheckpoints stores checkpoints by hand next to a ledger
// whose checkpoints #0 (size 3) and #1 (size 5) are intact.
func TestVerifyChecksCheckpoints(t *testing.T) {
	s, other := testSigner(t), otherSigner(t)
	opts := VerifyOptions{Verifier: testVerifier(t), Origin: testOrigin}
	sign := func(signer note.Signer, size uint64, root [32]byte) []byte {
		return mustSign(t, signer, Checkpoint{Origin: testOrigin, Size: size, Root: root})
	}
	for _, tc := range []struct {
		name string
		// put returns the checkpoints to store under the given numbers,
		// given the roots at sizes 0 to 5.
		put    func(roots [][32]byte) map[uint64][]byte
		opts   VerifyOptions
		want   error
		reason string
	}{
		{"signed by another key", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{1: sign(other, 5, r[5])}
		}, opts, &CheckpointError{Num: 1}, "not signed by key"},
		{"another origin", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{2: mustSign(t, s, Checkpoint{Origin: "elsewhere", Size: 5, Root: r[5]})}
		}, opts, &CheckpointError{Num: 2}, `origin "elsewhere", want "capkernel.test/ledger"`},
		{"signed root that is not the ledger's", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{0: sign(s, 3, r[2])}
		}, opts, &CheckpointError{Num: 0}, "for tree size 3 differs from the root"},
		{"last checkpoint with a wrong root", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{1: sign(s, 5, r[4])}
		}, opts, &CheckpointError{Num: 1}, "for tree size 5 differs from the root"},
		{"fork after the good one", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{2: sign(s, 5, r[4])}
		}, opts, &ForkError{Size: 5, First: 1, Second: 2}, "fork: checkpoints #1 and #2 are both for tree size 5"},
		{"fork before the good one", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{1: sign(s, 3, r[1]), 2: sign(s, 5, r[5])}
		}, opts, &ForkError{Size: 3, First: 0, Second: 1}, "fork: checkpoints #0 and #1 are both for tree size 3"},
		{"fork without a verifier", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{2: sign(other, 5, r[4])}
		}, VerifyOptions{}, &ForkError{Size: 5, First: 1, Second: 2}, "fork"},
		// Checkpoints are keyed by size first: #2 of size 4 sorts before
		// #1 of size 5, where #1 is due.
		{"size going down", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{2: sign(s, 4, r[4])}
		}, opts, &CheckpointError{Num: 1}, "stored under key 0000000000000004c00000000000000002, want 0000000000000004c00000000000000001"},
		{"size beyond the entries", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{2: sign(s, 6, r[5])}
		}, opts, &CheckpointError{Num: 2}, "is for tree size 6 but the ledger has 5 entries"},
		{"malformed note", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{1: []byte("garbage")}
		}, opts, &CheckpointError{Num: 1}, "malformed note"},
		{"malformed note without a verifier", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{1: []byte("garbage")}
		}, VerifyOptions{}, &CheckpointError{Num: 1}, "malformed note"},
		{"gap in the numbers", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{3: sign(s, 5, r[5])}
		}, opts, &CheckpointError{Num: 2}, "stored under key 0000000000000005c00000000000000003, want 0000000000000005c00000000000000002"},
		{"text byte flipped", func(r [][32]byte) map[uint64][]byte {
			return map[uint64][]byte{0: bytes.Replace(sign(s, 3, r[3]), []byte(testOrigin), []byte("capkernel.test/ledgeR"), 1)}
		}, opts, &CheckpointError{Num: 0}, "does not verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := twoCommits(t, s, 3, 2)
			var roots [][32]byte
			for i := range uint64(6) {
				roots = append(roots, rootAt(t, db, i))
			}
			if r, err := verifyDBWith(db, opts); err != nil || r.Checkpoints != 2 || r.Latest.Size != 5 || r.Root != roots[5] {
				t.Fatalf("before tampering: %+v, %v", r, err)
			}
			if err := db.Update(func(tx *bbolt.Tx) error {
				for num, signed := range tc.put(roots) {
					if err := putRawCheckpoint(tx, num, signed); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			_, err := verifyDBWith(db, tc.opts)
			checkErr(t, err, tc.want, tc.reason)
		})
	}
}

// TestVerifyWithoutVerifierIgnoresSignatures: without a verifier, a
// checkpoint by another key with the right root passes.
func TestVerifyWithoutVerifierIgnoresSignatures(t *testing.T) {
	db := newDB(t)
	appendBatch(t, db, 4)
	writeCheckpoint(t, db, otherSigner(t))
	if r, err := verifyDBWith(db, VerifyOptions{}); err != nil || r.Checkpoints != 1 {
		t.Errorf("Verify = %+v, %v", r, err)
	}
	if _, err := verifyDBWith(db, VerifyOptions{Verifier: testVerifier(t)}); err == nil {
		t.Error("Verify with the test key's verifier accepted another key's checkpoint")
	}
}

// twoCommits returns a ledger of two batches of a and b entries, each
// ending with a checkpoint signed by s.
func twoCommits(t *testing.T, s note.Signer, a, b int) *bbolt.DB {
	t.Helper()
	db := newDB(t)
	appendBatch(t, db, a)
	writeCheckpoint(t, db, s)
	appendBatch(t, db, b)
	writeCheckpoint(t, db, s)
	return db
}
