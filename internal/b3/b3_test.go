package b3

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/blake3"
)

// lengths covers every block and chunk boundary up to five chunks (a
// two-level tree with a left-over subtree), and some longer inputs.
func lengths() []int {
	var ns []int
	for n := 0; n <= 5*chunkLen+blockLen; n++ {
		ns = append(ns, n)
	}
	return append(ns, 8*chunkLen, 8*chunkLen+1, 31*chunkLen+7, 64*chunkLen, 100_000)
}

// randomInput returns n random bytes and a random key, from seed.
func randomInput(seed uint64, n int) (in []byte, raw [32]byte) {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	in = make([]byte, n)
	for i := range in {
		in[i] = byte(rng.Uint32())
	}
	for i := range raw {
		raw[i] = byte(rng.Uint32())
	}
	return in, raw
}

func TestAgainstZeebo(t *testing.T) {
	in, raw := randomInput(1, 100_000)
	key := KeyOf(&raw)
	if key.Bytes() != raw {
		t.Fatalf("KeyOf/Bytes do not round-trip")
	}
	const context = "capkernel b3 test context v1"
	ctx := ContextKey(context)
	for _, n := range lengths() {
		b := in[:n]
		zk, err := blake3.NewKeyed(raw[:])
		if err != nil {
			t.Fatal(err)
		}
		zk.Write(b)
		if got, want := Keyed(&key, b), zk.Sum(nil); !bytes.Equal(got[:], want) {
			t.Fatalf("Keyed of %d bytes: %x, zeebo/blake3 %x", n, got, want)
		}
		var want [32]byte
		blake3.DeriveKey(context, b, want[:])
		if got := DeriveKey(&ctx, b); got != want {
			t.Fatalf("DeriveKey of %d bytes: %x, zeebo/blake3 %x", n, got, want)
		}
		if got, want := hash(&iv, 0, b), blake3.Sum256(b); got.Bytes() != want {
			t.Fatalf("hash of %d bytes: %x, zeebo/blake3 %x", n, got.Bytes(), want)
		}
	}
}

// TestOfficialVectors checks the empty input's entries of the BLAKE3
// team's test_vectors.json, an implementation other than zeebo/blake3.
func TestOfficialVectors(t *testing.T) {
	key := KeyOf((*[32]byte)([]byte("whats the Elvish word for friend")))
	ctx := ContextKey("BLAKE3 2019-12-27 16:29:52 test vectors context")
	h := hash(&iv, 0, nil)
	for _, v := range []struct {
		mode string
		got  [32]byte
		want string
	}{
		{"hash", h.Bytes(), "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"},
		{"keyed_hash", Keyed(&key, nil), "92b2b75604ed3c761f9d6f62392c8a9227ad0ea3f09573e783f1498a4ed60d26"},
		{"derive_key", DeriveKey(&ctx, nil), "2cc39783c223154fea8dfb7c1b1660f2ac2dcbd1c1de8277b0b0dd39b7e50d7d"},
	} {
		if got := fmt.Sprintf("%x", v.got); got != v.want {
			t.Errorf("%s of the empty input: %s, want %s", v.mode, got, v.want)
		}
	}
}

func TestNoAllocs(t *testing.T) {
	in := make([]byte, 3000)
	var raw [32]byte
	key := KeyOf(&raw)
	if n := testing.AllocsPerRun(100, func() { Keyed(&key, in); DeriveKey(&key, in[:32]) }); n != 0 {
		t.Fatalf("%v allocations per hash", n)
	}
}

func BenchmarkKeyed(b *testing.B) {
	for _, n := range []int{64, 512, 1100, 4096, 16384} {
		in := make([]byte, n)
		var raw [32]byte
		key := KeyOf(&raw)
		b.Run(fmt.Sprintf("b3/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				Keyed(&key, in)
			}
		})
		b.Run(fmt.Sprintf("zeebo/%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				h, _ := blake3.NewKeyed(raw[:])
				h.Write(in)
				var sum [32]byte
				h.Sum(sum[:0])
			}
		})
	}
}
