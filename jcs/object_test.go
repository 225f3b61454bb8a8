package jcs

import (
	"encoding/json"
	"testing"
	"unicode/utf8"
)

// TestObject: an Object written member by member is the canonical form of
// the same members marshalled by encoding/json.
func TestObject(t *testing.T) {
	for _, c := range []struct {
		name  string
		build func(o *Object)
		want  map[string]any
	}{
		{"empty", func(o *Object) {}, map[string]any{}},
		{"members", func(o *Object) {
			o.Bool("a_false", false)
			o.Bool("b_true", true)
			o.Int("c_int", -42)
			o.Int("d_big", 1<<53+1)
			o.Opt("e_omitted", "")
			o.Raw("f_raw", []byte(`{"x":[1,"y"]}`))
			o.Str("g_str", "<&> \u2028 \x01 é \xff")
		}, map[string]any{
			"a_false": false, "b_true": true, "c_int": -42, "d_big": int64(1<<53 + 1),
			"f_raw": json.RawMessage(`{"x":[1,"y"]}`), "g_str": "<&> \u2028 \x01 é \xff",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o Object
			c.build(&o)
			got := o.End()
			m, err := json.Marshal(c.want)
			if err != nil {
				t.Fatal(err)
			}
			want, err := Canonicalize(m)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("Object wrote %s, want %s", got, want)
			}
		})
	}
}

// TestPlain: a string is Plain exactly when json.Marshal writes it as
// RFC 8785 does.
func TestPlain(t *testing.T) {
	ss := append(oddStrings, "a/b+c=", "tab\tx", "caf\u00e9 \u4e2d", "\x7f", "\u2027\u202a", "\xe2\x80", "<", ">", "&", "\u2028", "x\u2029")
	for c := range 0x20 {
		ss = append(ss, "a"+string(rune(c))+"b")
	}
	for _, s := range ss {
		m, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		same := string(m) == string(AppendString(nil, s)) && utf8.ValidString(s)
		if Plain(s) != same {
			t.Errorf("Plain(%q) = %v; json.Marshal writes %s, RFC 8785 %s", s, Plain(s), m, AppendString(nil, s))
		}
	}
}
