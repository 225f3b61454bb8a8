package syscalls

import (
	"context"
	"encoding/json"
	"fmt"
)

type kvGet struct{}

func (*kvGet) Definition() Definition {
	return Definition{
		ID:          "kv.get",
		Description: "Read a key of the kernel's versioned key-value store: its JSON value and version (0 when never written).",
		SideEffect:  Read,
		Resources:   []ResourceArg{{Arg: "key", Kind: KindKV, Access: AccessRead}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"key":{"type":"string","minLength":1,"maxLength":256,"pattern":"^[^\\x00]+$","description":"The key."}},
			"required":["key"],"additionalProperties":false}`),
	}
}

func (*kvGet) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Key string `json:"key"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	v, version, found, err := c.KV.GetKV(a.Key)
	if err != nil {
		return Output{}, fmt.Errorf("kv.get %q: %w", a.Key, err)
	}
	if !found {
		v = json.RawMessage("null")
	}
	return output(map[string]any{"key": a.Key, "found": found, "value": v, "version": version})
}

type kvPut struct{}

func (*kvPut) Definition() Definition {
	return Definition{
		ID:          "kv.put",
		Description: "Set a key of the kernel's versioned key-value store to a JSON value; returns the new version. Guard with a precondition {\"ref\":\"kv:<key>\",\"version\":N} to compare-and-set.",
		SideEffect:  Write,
		Resources:   []ResourceArg{{Arg: "key", Kind: KindKV, Access: AccessWrite}},
		InputSchema: json.RawMessage(`{"type":"object","properties":{
			"key":{"type":"string","minLength":1,"maxLength":256,"pattern":"^[^\\x00]+$","description":"The key."},
			"value":{"description":"Any JSON value."}},
			"required":["key","value"],"additionalProperties":false}`),
	}
}

func (*kvPut) Execute(_ context.Context, c *Call) (Output, error) {
	var a struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	if err := decodeArgs(c.Args, &a); err != nil {
		return Output{}, err
	}
	version, err := c.Stage.PutKV(a.Key, a.Value)
	if err != nil {
		return Output{}, fmt.Errorf("kv.put %q: %w", a.Key, err)
	}
	return output(map[string]any{"key": a.Key, "version": version})
}
