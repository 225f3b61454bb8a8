package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/mod/sumdb/note"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// lyingKernel is a kernel over HTTP whose operator holds the receipt key:
// it signs what checkpoint it likes and answers proof requests with the
// proof it likes, whatever sizes were asked for.
type lyingKernel struct {
	t      *testing.T
	url    string
	pubkey string // a JWKS file of the signing key
	signer func(size uint64, root [32]byte) kernel.SignedCheckpoint

	mu          sync.Mutex
	checkpoint  kernel.SignedCheckpoint
	consistency func(from, to string) kernel.ConsistencyResponse
	inclusion   kernel.InclusionResponse
}

// checkpointKey makes a fresh key for checkpoints of origin: its public
// key, its signer and its verifier key.
func checkpointKey(t *testing.T, origin string) (ed25519.PublicKey, note.Signer, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ledger.NewCheckpointSigner(origin, priv)
	if err != nil {
		t.Fatal(err)
	}
	vkey, err := ledger.CheckpointVerifierKey(origin, pub)
	if err != nil {
		t.Fatal(err)
	}
	return pub, signer, vkey
}

func newLyingKernel(t *testing.T) *lyingKernel {
	const origin = "ck-00000000-0000-4000-8000-00000000f1f1"
	pub, signer, vkey := checkpointKey(t, origin)
	k := &lyingKernel{t: t}
	k.signer = func(size uint64, root [32]byte) kernel.SignedCheckpoint {
		n, err := ledger.SignCheckpoint(signer, ledger.Checkpoint{Origin: origin, Size: size, Root: root})
		if err != nil {
			t.Fatal(err)
		}
		return kernel.SignedCheckpoint{Origin: origin, Size: size, Root: digest.Format(root), Note: string(n), VerifierKey: vkey}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.mu.Lock()
		defer k.mu.Unlock()
		var v any
		switch r.URL.Path {
		case "/v1/ledger/checkpoint":
			v = k.checkpoint
		case "/v1/ledger/proof/consistency":
			v = k.consistency(r.URL.Query().Get("from"), r.URL.Query().Get("to"))
		case "/v1/ledger/proof/inclusion":
			v = k.inclusion
		default:
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(srv.Close)
	k.url = srv.URL
	jwks, err := receipts.JWKS(pub)
	if err != nil {
		t.Fatal(err)
	}
	k.pubkey = filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(k.pubkey, jwks, 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestProofOfOtherSizesRefused: kernelctl verifies every proof it asks
// for with the sizes (and entry) it asked for, never the answer's own. A
// kernel that signs (10, NodeHash(R1, X)) after (3, R1) and answers "from=3
// to=10" with the proof of sizes 1 → 2, [X] (which verifies: R1 read as
// entry 0) has rewritten its history; the witness (ledger checkpoint
// --state), ledger consistency and ledger prove all exit 1, and the witness
// keeps the checkpoint it remembered (review rev-verify F1).
func TestProofOfOtherSizesRefused(t *testing.T) {
	var r1, x [32]byte
	rand.Read(r1[:])
	rand.Read(x[:])
	r2 := ledger.NodeHash(r1, x)
	// forged answers any consistency request with the proof of sizes
	// 1 → 2, and one from 2 with the empty proof of sizes 10 → 10.
	forged := func(from, _ string) kernel.ConsistencyResponse {
		if from == "2" {
			return kernel.ConsistencyResponse{Consistency: ledger.Consistency{Size1: 10, Size2: 10, Proof: []string{}}, Root1: digest.Format(r2), Root2: digest.Format(r2)}
		}
		return kernel.ConsistencyResponse{Consistency: ledger.Consistency{Size1: 1, Size2: 2, Proof: []string{digest.Format(x)}}, Root1: digest.Format(r1), Root2: digest.Format(r2)}
	}
	for _, tc := range []struct {
		name  string
		first *[2]any // a checkpoint (size, root) the witness saw before, if any
		size  uint64  // the checkpoint served
		root  [32]byte
		args  []string
		want  string
	}{
		{"witness: a newer checkpoint", &[2]any{uint64(3), r1}, 10, r2, []string{"ledger", "checkpoint"}, "INCONSISTENT with the checkpoint of size 3"},
		{"witness: an older checkpoint", &[2]any{uint64(10), r2}, 3, r1, []string{"ledger", "checkpoint"}, "INCONSISTENT: the checkpoint of size 3 is no prefix of the checkpoint of size 10"},
		{"ledger consistency", nil, 10, r2, []string{"ledger", "consistency", "--from", "3", "--to", "10"}, "consistency proof NOT verified"},
		{"ledger prove of another entry", nil, 10, r2, []string{"ledger", "prove", "--seq", "2", "--size", "3"}, "inclusion proof NOT verified"},
		{"ledger prove in a tree proven by other sizes", nil, 10, r2, []string{"ledger", "prove", "--seq", "0"}, "inclusion proof NOT verified"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newLyingKernel(t)
			// Under mu, as the server's reads: the race detector sees no
			// order through the loopback connection.
			k.mu.Lock()
			k.consistency = forged
			// The inclusion answer: R1 as entry 0 of the tree of 1 entry.
			k.inclusion = kernel.InclusionResponse{Inclusion: ledger.Inclusion{LeafIndex: 0, TreeSize: 1, LeafHash: digest.Format(r1), Proof: []string{}}, Root: digest.Format(r1)}
			k.mu.Unlock()
			state := filepath.Join(t.TempDir(), "state")
			args := append(tc.args, "--server", k.url, "--pubkey", k.pubkey)
			if tc.args[1] == "checkpoint" {
				args = append(args, "--state", state)
			}
			var remembered string
			if tc.first != nil {
				k.mu.Lock()
				k.checkpoint = k.signer(tc.first[0].(uint64), tc.first[1].([32]byte))
				remembered = k.checkpoint.Note
				k.mu.Unlock()
				if _, stderr, code := run(t, args...); code != 0 {
					t.Fatalf("first checkpoint: exit %d: %s", code, stderr)
				}
			}
			k.mu.Lock()
			k.checkpoint = k.signer(tc.size, tc.root)
			k.mu.Unlock()
			out, stderr, code := run(t, args...)
			if code != 1 || !strings.Contains(stderr, tc.want) {
				t.Fatalf("exit %d, want 1 with %q:\n%s%s", code, tc.want, out, stderr)
			}
			if tc.first != nil {
				k.mu.Lock()
				origin := k.checkpoint.Origin
				k.mu.Unlock()
				seen, err := loadSeen(checkpointState{dir: state}.originPath(origin))
				if err != nil || seen == nil || seen.Note != remembered {
					t.Fatalf("remembered %+v %v, want the first checkpoint still", seen, err)
				}
			}
		})
	}
}
