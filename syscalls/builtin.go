package syscalls

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/capkernel/capkernel/jcs"
)

// RegisterBuiltins registers echo, fs.read, fs.list, fs.stat, fs.write,
// fs.patch, fs.delete, kv.get and kv.put.
func RegisterBuiltins(r *Registry) error {
	for _, f := range []Factory{
		func() Syscall { return &echo{} },
		func() Syscall { return &fsRead{} },
		func() Syscall { return &fsList{} },
		func() Syscall { return &fsStat{} },
		func() Syscall { return &fsWrite{} },
		func() Syscall { return &fsPatch{} },
		func() Syscall { return &fsDelete{} },
		func() Syscall { return &kvGet{} },
		func() Syscall { return &kvPut{} },
	} {
		if err := r.Register(f); err != nil {
			return err
		}
	}
	return nil
}

// decodeArgs unmarshals validated args into v.
func decodeArgs(args json.RawMessage, v any) error {
	if err := json.Unmarshal(args, v); err != nil {
		return &ArgsError{Violations: []string{err.Error()}}
	}
	return nil
}

// output encodes v as a syscall's result object.
func output(v any) (Output, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return Output{}, fmt.Errorf("encode result: %w", err)
	}
	return Output{Result: b}, nil
}

type echo struct{}

func (*echo) Definition() Definition {
	return Definition{
		ID:          "echo",
		Description: "Return the given text unchanged. Useful to test the call path; touches nothing.",
		SideEffect:  None,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string","description":"Text to echo back."}},"required":["text"],"additionalProperties":false}`),
	}
}

func (*echo) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Text string `json:"text"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	o := jcs.Object{B: make([]byte, 0, len(a.Text)+16)}
	o.Str("text", a.Text)
	canon := o.End()
	if jcs.Plain(a.Text) {
		// json.Marshal(a) would write these very bytes.
		return Output{Result: canon, Canonical: canon}, nil
	}
	out, err := output(a)
	out.Canonical = canon
	return out, err
}
