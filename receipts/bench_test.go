package receipts

import (
	"testing"

	"github.com/lestrrat-go/jwx/v4/jwa"
	"github.com/lestrrat-go/jwx/v4/jws"

	"github.com/capkernel/capkernel/jcs"
)

func BenchmarkSign(b *testing.B) {
	s := NewSigner(testKey(b))
	r := testReceipt()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Sign(r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignJWX is the same signature made with jws.Sign, the
// alternative to Signer's hand-built serialization.
func BenchmarkSignJWX(b *testing.B) {
	key := testKey(b)
	s := NewSigner(key)
	hdr := jws.NewHeaders()
	if err := hdr.Set(jws.KeyIDKey, s.KeyID()); err != nil {
		b.Fatal(err)
	}
	if err := hdr.Set(jws.TypeKey, Type); err != nil {
		b.Fatal(err)
	}
	r := testReceipt()
	b.ReportAllocs()
	for b.Loop() {
		payload, err := jcs.Marshal(r)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := jws.Sign(payload, jws.WithKey(jwa.EdDSA(), key, jws.WithProtectedHeaders(hdr))); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	key := testKey(b)
	signed, err := NewSigner(key).Sign(testReceipt())
	if err != nil {
		b.Fatal(err)
	}
	set := jwksOf(b, key)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Verify(signed, set); err != nil {
			b.Fatal(err)
		}
	}
}
