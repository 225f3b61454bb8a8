package captoken

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"github.com/capkernel/capkernel/strictjson"
)

// Claims are the contents of a token.
//
// Times travel as NumericDate in whole seconds: Mint drops any fraction of
// a second, Verify returns them in UTC, and Validate compares them at that
// precision.
type Claims struct {
	Issuer    string // iss; may be empty
	Subject   string // sub: the agent id the token is for
	Audience  string // aud: the kernel id the token is for
	ID        string // jti: the token id a call envelope names
	IssuedAt  time.Time
	NotBefore time.Time
	Expiry    time.Time
	Cap       Capability
}

// Capability is what a token grants. The JSON field names are the wire
// format of the cap claim.
type Capability struct {
	// Tools lists the tool ids the token may call, as patterns: "*"
	// matches every id; "p.*" matches every id that starts with "p."
	// (any depth: "mcp.*" matches "mcp.github.create_issue"); any other
	// pattern matches only the id equal to it. See AllowsTool.
	Tools []string `json:"tools"`
	// FS lists the file trees the token's calls may touch.
	FS []FSRoot `json:"fs,omitempty"`
	// Net lists the hosts the token's calls may reach, as host[:port]
	// patterns. See AllowsHost.
	Net []string `json:"net,omitempty"`
	// KV lists the keys of the kernel's key-value store the token's calls
	// may read or write. See KVScope and AllowsKey.
	KV []KVScope `json:"kv,omitempty"`
	// Budgets caps what the token's calls may consume, by BudgetCalls,
	// BudgetCPUMillis, BudgetDiskWriteBytes and BudgetNetBytes. An absent
	// key means no limit; values are >= 0.
	Budgets map[string]int64 `json:"budgets,omitempty"`
	// Autonomy is the most autonomous mode the token's calls may run in:
	// "autopilot", "soft_gate", "escalated" or "no_go" (from most to least
	// autonomous). Empty means "autopilot".
	Autonomy string `json:"autonomy,omitempty"`
	// Parent is the jti of the token this one was attenuated from, or
	// empty for a root token.
	Parent string `json:"parent,omitempty"`
	// Ancestors are the tokens this one was attenuated from, root first
	// and Parent last (see Ancestor and Narrows): revoking any of them
	// revokes this token, and its calls are charged to each one's budgets.
	Ancestors []Ancestor `json:"ancestors,omitempty"`
	// Role makes the token a person's credential instead of an agent's:
	// RoleApprover may decide soft_gate calls, RoleEscalation also
	// escalated ones, RoleAuditor reads every record of the history in
	// full and decides nothing. A role token grants nothing else: no
	// tools, fs, net or budgets, so no credential can both act and approve
	// or act and read other agents' records.
	Role string `json:"role,omitempty"`
	// Handles puts the token's sessions in handle mode: its
	// calls address tools only by the per-session handles the kernel hands
	// out, never by name.
	Handles bool `json:"handles,omitempty"`
}

// Roles of role tokens (Capability.Role).
const (
	RoleApprover   = "approver"
	RoleEscalation = "escalation"
	RoleAuditor    = "auditor"
)

// FSRoot is a file tree a token grants access to.
type FSRoot struct {
	Path string `json:"path"` // absolute and clean, e.g. "/srv/work"
	Mode string `json:"mode"` // "r" (read) or "rw" (read and write)
	// Base, set on the roots of an attenuated token, is the root of the
	// root token that Path lies in. The kernel opens Path from Base and
	// refuses it when the way there passes a symbolic link, so that a
	// delegator who can write below Base cannot point a child's root
	// outside what it holds itself.
	Base string `json:"base,omitempty"`
}

// BaseOrPath is r's Base, or its Path for a root token's root.
func (r FSRoot) BaseOrPath() string {
	if r.Base != "" {
		return r.Base
	}
	return r.Path
}

// Budget keys of Capability.Budgets.
const (
	BudgetCalls          = "calls"            // number of calls
	BudgetCPUMillis      = "cpu_ms"           // CPU time of executed processes, in milliseconds
	BudgetDiskWriteBytes = "disk_write_bytes" // bytes written to files and kv values
	BudgetNetBytes       = "net_bytes"        // bytes sent and received over the network
)

var budgetKeys = []string{BudgetCalls, BudgetCPUMillis, BudgetDiskWriteBytes, BudgetNetBytes}

var autonomyModes = []string{"", "autopilot", "soft_gate", "escalated", "no_go"}

// Validate reports whether c is a well-formed token's claims: sub, aud and
// jti are non-empty; iat, nbf and exp are set and exp is after nbf; tools
// holds at least one valid pattern; every fs root is absolute and clean
// with mode "r" or "rw"; every net pattern is valid; every kv scope is
// valid (KVScope); budget keys are known
// and values >= 0; autonomy is a known mode. It says nothing about whether
// the token is currently valid or for whom; that is Verify's job.
func (c Claims) Validate() error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("captoken: invalid claims: %w", err)
	}
	return nil
}

func (c Claims) validate() error {
	switch {
	case c.Subject == "":
		return errors.New("sub is empty")
	case c.Audience == "":
		return errors.New("aud is empty")
	case c.ID == "":
		return errors.New("jti is empty")
	case c.IssuedAt.IsZero():
		return errors.New("iat is not set")
	case c.NotBefore.IsZero():
		return errors.New("nbf is not set")
	case c.Expiry.IsZero():
		return errors.New("exp is not set")
	case c.Expiry.Unix() <= c.NotBefore.Unix():
		return fmt.Errorf("exp %d is not after nbf %d", c.Expiry.Unix(), c.NotBefore.Unix())
	}
	return c.Cap.validate()
}

func (c Capability) validate() error {
	switch c.Role {
	case "":
	case RoleApprover, RoleEscalation, RoleAuditor:
		if len(c.Tools) > 0 || len(c.FS) > 0 || len(c.Net) > 0 || len(c.KV) > 0 || len(c.Budgets) > 0 || c.Parent != "" {
			return fmt.Errorf("cap.role %q: a role token may grant no tools, fs, net, kv or budgets and have no parent", c.Role)
		}
		return nil
	default:
		return fmt.Errorf("cap.role %q is not approver, escalation or auditor", c.Role)
	}
	if len(c.Tools) == 0 {
		return errors.New("cap.tools names no tool")
	}
	for i, p := range c.Tools {
		if err := validToolPattern(p); err != nil {
			return fmt.Errorf("cap.tools[%d]: %w", i, err)
		}
	}
	for i, r := range c.FS {
		if !filepath.IsAbs(r.Path) || filepath.Clean(r.Path) != r.Path {
			return fmt.Errorf("cap.fs[%d].path %q is not an absolute, clean path", i, r.Path)
		}
		if r.Mode != "r" && r.Mode != "rw" {
			return fmt.Errorf("cap.fs[%d].mode %q is not r or rw", i, r.Mode)
		}
		if r.Base != "" && (!filepath.IsAbs(r.Base) || filepath.Clean(r.Base) != r.Base || !within(r.Path, r.Base)) {
			return fmt.Errorf("cap.fs[%d].base %q is not an absolute, clean path containing %q", i, r.Base, r.Path)
		}
	}
	for i, p := range c.Net {
		if _, err := parseHostPattern(p); err != nil {
			return fmt.Errorf("cap.net[%d]: %w", i, err)
		}
	}
	for i, k := range c.KV {
		if err := validKVScope(k); err != nil {
			return fmt.Errorf("cap.kv[%d]: %w", i, err)
		}
	}
	for k, v := range c.Budgets {
		if !slices.Contains(budgetKeys, k) {
			return fmt.Errorf("cap.budgets has unknown key %q", k)
		}
		if v < 0 {
			return fmt.Errorf("cap.budgets[%q] is negative (%d)", k, v)
		}
	}
	if n := len(c.Ancestors); n > 0 {
		if n > MaxChainDepth {
			return fmt.Errorf("cap.ancestors: %d attenuations exceed the limit of %d", n, MaxChainDepth)
		}
		if c.Ancestors[n-1].ID != c.Parent {
			return fmt.Errorf("cap.ancestors ends in %q, not the parent %q", c.Ancestors[n-1].ID, c.Parent)
		}
		for i, a := range c.Ancestors {
			if a.ID == "" {
				return fmt.Errorf("cap.ancestors[%d] has no jti", i)
			}
			for k, v := range a.Budgets {
				if !slices.Contains(budgetKeys, k) || v < 0 {
					return fmt.Errorf("cap.ancestors[%d].budgets[%q] = %d is not a known budget >= 0", i, k, v)
				}
			}
		}
	}
	if !slices.Contains(autonomyModes, c.Autonomy) {
		return fmt.Errorf("cap.autonomy %q is not autopilot, soft_gate, escalated or no_go", c.Autonomy)
	}
	return nil
}

// clone returns a copy of c that shares no memory with it, so a caller
// changing a verified token cannot change what the cache holds.
func (c Claims) clone() Claims {
	c.Cap.Tools = slices.Clone(c.Cap.Tools)
	c.Cap.FS = slices.Clone(c.Cap.FS)
	c.Cap.Net = slices.Clone(c.Cap.Net)
	c.Cap.KV = slices.Clone(c.Cap.KV)
	c.Cap.Budgets = maps.Clone(c.Cap.Budgets)
	if c.Cap.Ancestors != nil {
		as := make([]Ancestor, len(c.Cap.Ancestors))
		for i, a := range c.Cap.Ancestors {
			as[i] = Ancestor{ID: a.ID, Budgets: maps.Clone(a.Budgets)}
		}
		c.Cap.Ancestors = as
	}
	return c
}

// payload is the JSON form of Claims. Pointers tell absent claims from
// zero ones.
type payload struct {
	Issuer    string      `json:"iss,omitempty"`
	Subject   string      `json:"sub"`
	Audience  string      `json:"aud"`
	ID        string      `json:"jti"`
	IssuedAt  *int64      `json:"iat"`
	NotBefore *int64      `json:"nbf"`
	Expiry    *int64      `json:"exp"`
	Cap       *Capability `json:"cap"`
}

func marshalClaims(c Claims) ([]byte, error) {
	iat, nbf, exp := c.IssuedAt.Unix(), c.NotBefore.Unix(), c.Expiry.Unix()
	return json.Marshal(payload{
		Issuer:    c.Issuer,
		Subject:   c.Subject,
		Audience:  c.Audience,
		ID:        c.ID,
		IssuedAt:  &iat,
		NotBefore: &nbf,
		Expiry:    &exp,
		Cap:       &c.Cap,
	})
}

// unmarshalClaims decodes a token payload by the strictjson rules (unknown
// fields, duplicate names and invalid UTF-8 refused at any depth, no
// trailing data), refusing absent time or cap claims. It does not validate.
func unmarshalClaims(b []byte) (Claims, error) {
	var p payload
	if err := strictjson.Unmarshal(b, &p); err != nil {
		return Claims{}, err
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"iat", p.IssuedAt}, {"nbf", p.NotBefore}, {"exp", p.Expiry}} {
		if f.v == nil {
			return Claims{}, fmt.Errorf("no %s claim", f.name)
		}
	}
	if p.Cap == nil {
		return Claims{}, errors.New("no cap claim")
	}
	return Claims{
		Issuer:    p.Issuer,
		Subject:   p.Subject,
		Audience:  p.Audience,
		ID:        p.ID,
		IssuedAt:  time.Unix(*p.IssuedAt, 0).UTC(),
		NotBefore: time.Unix(*p.NotBefore, 0).UTC(),
		Expiry:    time.Unix(*p.Expiry, 0).UTC(),
		Cap:       *p.Cap,
	}, nil
}
