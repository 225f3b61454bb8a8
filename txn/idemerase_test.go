package txn

import (
	"encoding/json"
	"errors"
	"testing"

	"go.etcd.io/bbolt"
)

// TestEraseResultForgetsArgs: the erased form of a key's row holds no
// args_hash, and Lookup answers a repeat of the same tool and token with
// the erased outcome whatever its args hash, while another tool or token
// is still a conflict; a row held by another operation, or still in
// flight, is left as it was.
func TestEraseResultForgetsArgs(t *testing.T) {
	const erased = `{"op":"x","erased":true}`
	e := newEnv(t)
	p := newPrepare("op-x", "key-x") // fs.write, args h1, token tok
	if _, err := e.prepare(p); err != nil {
		t.Fatal(err)
	}
	e.commit(&p.Intent, nil, `{"op":"x","result":"4711"}`)
	running := newPrepare("op-r", "key-r")
	if _, err := e.prepare(running); err != nil {
		t.Fatal(err)
	}
	kx := IdemKey{AgentID: "agent", Key: "key-x"}
	kr := IdemKey{AgentID: "agent", Key: "key-r"}
	if err := e.update(func(tx *bbolt.Tx) error {
		if err := EraseResult(tx, kx, "op-other", []byte(erased)); err != nil {
			return err
		}
		if err := EraseResult(tx, kr, "op-r", []byte(erased)); err != nil {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	row := func(k IdemKey) (r idemRecord) {
		t.Helper()
		e.view(func(tx *bbolt.Tx) error { return json.Unmarshal(tx.Bucket(bucketIdem).Get(k.bytes()), &r) })
		return r
	}
	for _, k := range []IdemKey{kx, kr} {
		if r := row(k); r.ArgsErased || r.ArgsHash != "h1" {
			t.Fatalf("key %s, not erased by its operation: %+v", k.Key, r)
		}
	}
	e.view(func(tx *bbolt.Tx) error {
		if _, err := Lookup(tx, kx, Call{ToolID: "fs.write", ArgsHash: "h2", TokenID: "tok"}); errClass(err) != ClassConflict {
			t.Errorf("other args before the erasure: %v, want %s", err, ClassConflict)
		}
		return nil
	})

	if err := e.update(func(tx *bbolt.Tx) error { return EraseResult(tx, kx, "op-x", []byte(erased)) }); err != nil {
		t.Fatal(err)
	}
	if r := row(kx); !r.ArgsErased || r.ArgsHash != "" || r.ToolID != "fs.write" || r.TokenID != "tok" || r.OperationID != "op-x" || !r.Done {
		t.Fatalf("erased row %+v", r)
	}
	for _, tc := range []struct {
		name  string
		call  Call
		class string // "" for a replay of the erased outcome
	}{
		{"the erased args", Call{ToolID: "fs.write", ArgsHash: "h1", TokenID: "tok"}, ""},
		{"other args", Call{ToolID: "fs.write", ArgsHash: "h2", TokenID: "tok"}, ""},
		{"no args hash", Call{ToolID: "fs.write", TokenID: "tok"}, ""},
		{"another tool", Call{ToolID: "fs.delete", ArgsHash: "h1", TokenID: "tok"}, ClassConflict},
		{"another token, the erased args", Call{ToolID: "fs.write", ArgsHash: "h1", TokenID: "tok2"}, ClassConflict},
		{"another token, other args", Call{ToolID: "fs.write", ArgsHash: "h2", TokenID: "tok2"}, ClassConflict},
	} {
		e.view(func(tx *bbolt.Tx) error {
			got, err := Lookup(tx, kx, tc.call)
			switch {
			case tc.class == "" && (err != nil || string(got) != erased):
				t.Errorf("%s: Lookup = %s, %v; want the erased outcome %s", tc.name, got, err, erased)
			case tc.class != "" && (got != nil || errClass(err) != tc.class):
				t.Errorf("%s: Lookup = %s, %v; want %s", tc.name, got, err, tc.class)
			}
			return nil
		})
	}
	e.view(func(tx *bbolt.Tx) error {
		return ForEachIdem(tx, func(ie IdemEntry) error {
			if ie.Key == kx && (ie.ArgsHash != "" || string(ie.Result) != erased) {
				t.Errorf("ForEachIdem: erased row %+v", ie)
			}
			return nil
		})
	})
}

// errClass is the class of a txn refusal, or "" for any other error.
func errClass(err error) string {
	var te *Error
	if errors.As(err, &te) {
		return te.Class
	}
	return ""
}
