package captoken

import (
	"fmt"
	"strings"
)

// KVScope grants keys of the kernel's key-value store (kv.get, kv.put and
// kv: precondition refs): Keys is "*" (every key), "p*" (every key that
// starts with p, p itself included) or one key exactly; Mode is "r" (read)
// or "rw" (read and write). The store is the kernel's, shared by every
// agent, so a token reaches only the keys its scopes name: without any,
// none.
type KVScope struct {
	Keys string `json:"keys"`
	Mode string `json:"mode"`
}

// AllowsKey reports whether a kv scope of c grants key, for writing when
// write is set.
func (c Capability) AllowsKey(key string, write bool) bool {
	for _, s := range c.KV {
		if (!write || s.Mode == "rw") && matchKey(s.Keys, key) {
			return true
		}
	}
	return false
}

// matchKey reports whether the key pattern p matches key.
func matchKey(p, key string) bool {
	if prefix, wild := strings.CutSuffix(p, "*"); wild {
		return strings.HasPrefix(key, prefix)
	}
	return p == key
}

// coversKeys reports whether a scope of ps matches every key s matches,
// with at least s's mode: for one key, a scope matching it; for a prefix,
// a prefix scope matching the prefix.
func coversKeys(ps []KVScope, s KVScope) bool {
	prefix, wild := strings.CutSuffix(s.Keys, "*")
	for _, p := range ps {
		if (s.Mode != "rw" || p.Mode == "rw") && matchKey(p.Keys, prefix) && (!wild || strings.HasSuffix(p.Keys, "*")) {
			return true
		}
	}
	return false
}

// validKVScope checks one kv scope: a non-empty pattern without NUL
// (keys cannot hold one), "*" only at its end, and mode r or rw.
func validKVScope(s KVScope) error {
	body, _ := strings.CutSuffix(s.Keys, "*")
	switch {
	case s.Keys == "":
		return fmt.Errorf("keys is empty")
	case strings.ContainsAny(body, "*\x00"):
		return fmt.Errorf("keys %q has a NUL or a * before its end", s.Keys)
	case s.Mode != "r" && s.Mode != "rw":
		return fmt.Errorf("mode %q is not r or rw", s.Mode)
	}
	return nil
}
