package kernel

import (
	"bytes"
	"encoding/json/jsontext"
	"fmt"
	"strings"
	"unicode/utf8"
)

// summaryMax bounds an approval's input_summary after the tool id.
const summaryMax = 512

// summaryShort is the length up to which a member's value always shows
// whole.
const summaryShort = 64

// argsSummary describes the canonical args for an approver in about
// summaryMax bytes: every top-level member, in canonical order, with its
// canonical value; values longer than summaryShort share what the short
// ones leave, each cut at a character boundary and marked with the bytes
// left out ("…(+N bytes)"), so no long value hides the others (a path
// after a large content) and layout (whitespace) counts for nothing.
// Args that are not an object (never, past step 4) are cut the same way.
func argsSummary(canon []byte) string {
	type member struct{ name, value string }
	var ms []member
	dec := jsontext.NewDecoder(bytes.NewReader(canon))
	if t, err := dec.ReadToken(); err != nil || t.Kind() != '{' {
		return cut(string(canon), summaryMax)
	}
	for dec.PeekKind() == '"' {
		t, err := dec.ReadToken()
		if err != nil {
			break
		}
		name := t.String()
		v, err := dec.ReadValue()
		if err != nil {
			break
		}
		ms = append(ms, member{name, string(v)})
	}
	budget, long := summaryMax, 0
	for _, m := range ms {
		budget -= len(m.name) + 4 // quotes, colon, comma
		if len(m.value) <= summaryShort {
			budget -= len(m.value)
		} else {
			long++
		}
	}
	each := summaryShort
	if long > 0 {
		each = max(budget/long, summaryShort)
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, m := range ms {
		if i > 0 {
			b.WriteByte(',')
		}
		q, _ := jsontext.AppendQuote(nil, m.name)
		b.Write(q)
		b.WriteByte(':')
		b.WriteString(cut(m.value, each))
	}
	b.WriteByte('}')
	return b.String()
}

// cut returns s whole if it has at most n bytes, else its first bytes up to
// a character boundary within n and a mark of how many bytes were left out.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return fmt.Sprintf("%s…(+%d bytes)", s[:i], len(s)-i)
}
