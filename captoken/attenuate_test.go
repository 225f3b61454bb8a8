package captoken

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestNarrows(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	parent := Claims{
		Subject: "a", Audience: "k", ID: "P", IssuedAt: t0, NotBefore: t0, Expiry: t0.Add(time.Hour),
		Cap: Capability{
			Tools:     []string{"fs.*", "echo", "mcp.gh.*"},
			FS:        []FSRoot{{Path: "/srv/work", Mode: "rw"}, {Path: "/srv/work/locked", Mode: "r"}, {Path: "/srv/ref", Mode: "r"}},
			Net:       []string{"*.example.com", "api.other.org:443", "192.0.2.1"},
			KV:        []KVScope{{Keys: "a/*", Mode: "rw"}, {Keys: "shared/*", Mode: "r"}, {Keys: "motd", Mode: "r"}},
			Budgets:   map[string]int64{BudgetCalls: 100, BudgetNetBytes: 1 << 20},
			Autonomy:  "soft_gate",
			Parent:    "G",
			Ancestors: []Ancestor{{ID: "G", Budgets: map[string]int64{BudgetCalls: 1000}, FS: []FSRoot{{Path: "/srv", Mode: "rw"}, {Path: "/srv/work/locked", Mode: "r"}}}},
		},
	}
	ok := func() Claims {
		c := parent.clone()
		c.ID, c.Subject = "C", "a/sub-agent"
		c.Cap.Budgets = map[string]int64{BudgetCalls: 10, BudgetNetBytes: 1024}
		c.Cap.Parent = "P"
		c.Cap.Ancestors = append(c.Cap.Ancestors, AsAncestor(parent))
		for i := range c.Cap.FS {
			c.Cap.FS[i].Base = c.Cap.FS[i].Path
		}
		return c
	}
	cases := []struct {
		name  string
		edit  func(c *Claims)
		field string // "" for a narrowing
	}{
		{"same scopes, lower budgets", func(c *Claims) {}, ""},
		{"narrower everything", func(c *Claims) {
			c.Cap.Tools = []string{"fs.read", "fs.dir.*", "mcp.gh.issues.*"}
			c.Cap.FS = []FSRoot{{Path: "/srv/work/sub", Mode: "r", Base: "/srv/work"}, {Path: "/srv/ref", Mode: "r", Base: "/srv/ref"}}
			c.Cap.Net = []string{"*.b.example.com", "*.example.com:8443", "api.other.org:443", "192.0.2.1:80"}
			c.Cap.KV = []KVScope{{Keys: "a/b/*", Mode: "r"}, {Keys: "a/x", Mode: "rw"}, {Keys: "shared/n", Mode: "r"}, {Keys: "motd", Mode: "r"}}
			c.Cap.Autonomy = "no_go"
			c.Expiry = c.Expiry.Add(-time.Minute)
			c.NotBefore = c.NotBefore.Add(time.Second)
		}, ""},
		{"tool outside", func(c *Claims) { c.Cap.Tools = []string{"proc.exec"} }, "tools"},
		{"tool glob wider", func(c *Claims) { c.Cap.Tools = []string{"mcp.*"} }, "tools"},
		{"tool star", func(c *Claims) { c.Cap.Tools = []string{"*"} }, "tools"},
		{"tool prefix trick", func(c *Claims) { c.Cap.Tools = []string{"fsx.read"} }, "tools"},
		{"exact tool is not its glob", func(c *Claims) { c.Cap.Tools = []string{"echo.*"} }, "tools"},
		{"path outside", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv", Mode: "r", Base: "/srv"}} }, "fs"},
		{"sibling path with shared prefix", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/workshop", Mode: "r", Base: "/srv/work"}} }, "fs"},
		{"mode upgraded", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/ref/x", Mode: "rw", Base: "/srv/ref"}} }, "fs"},
		// The parent's /srv/work/locked is read-only inside its writable
		// /srv/work: the innermost root decides a path's mode.
		{"rw root over the parent's read-only root", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/work", Mode: "rw", Base: "/srv/work"}} }, "fs"},
		{"rw root inside the parent's read-only root", func(c *Claims) {
			c.Cap.FS = []FSRoot{{Path: "/srv/work/locked/x", Mode: "rw", Base: "/srv/work"}}
		}, "fs"},
		{"rw root on the parent's read-only root", func(c *Claims) {
			c.Cap.FS = []FSRoot{{Path: "/srv/work/locked", Mode: "rw", Base: "/srv/work/locked"}}
		}, "fs"},
		{"rw root keeping the read-only root", func(c *Claims) {
			c.Cap.FS = []FSRoot{{Path: "/srv/work", Mode: "rw", Base: "/srv/work"}, {Path: "/srv/work/locked", Mode: "r", Base: "/srv/work"}}
		}, ""},
		{"read-only root kept, doubled rw", func(c *Claims) {
			c.Cap.FS = []FSRoot{{Path: "/srv/work", Mode: "rw", Base: "/srv/work"}, {Path: "/srv/work/locked", Mode: "r", Base: "/srv/work/locked"}, {Path: "/srv/work/locked", Mode: "rw", Base: "/srv/work/locked"}}
		}, "fs"},
		{"rw root beside the read-only root", func(c *Claims) {
			c.Cap.FS = []FSRoot{{Path: "/srv/work/lockedx", Mode: "rw", Base: "/srv/work"}}
		}, ""},
		{"read-only root inside the read-only root", func(c *Claims) {
			c.Cap.FS = []FSRoot{{Path: "/srv/work/locked/x", Mode: "r", Base: "/srv/work/locked"}}
		}, ""},
		{"base dropped", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/work/sub", Mode: "r"}} }, "fs"},
		{"base moved up", func(c *Claims) { c.Cap.FS = []FSRoot{{Path: "/srv/work/sub", Mode: "r", Base: "/srv"}} }, "fs"},
		{"the parent's own agent", func(c *Claims) { c.Subject = "a" }, ""},
		{"a sub-agent's sub-agent", func(c *Claims) { c.Subject = "a/x/y" }, ""},
		{"another agent", func(c *Claims) { c.Subject = "b" }, "sub"},
		{"an agent sharing the prefix", func(c *Claims) { c.Subject = "ab/x" }, "sub"},
		{"an empty sub-agent name", func(c *Claims) { c.Subject = "a/" }, "sub"},
		{"a sub-agent name ending in a slash", func(c *Claims) { c.Subject = "a/x/" }, "sub"},
		{"an empty name inside", func(c *Claims) { c.Subject = "a//x" }, "sub"},
		{"an empty name deeper", func(c *Claims) { c.Subject = "a/x//y" }, "sub"},
		{"host outside", func(c *Claims) { c.Cap.Net = []string{"evil.com"} }, "net"},
		{"kv keys outside", func(c *Claims) { c.Cap.KV = []KVScope{{Keys: "b/*", Mode: "r"}} }, "kv"},
		{"kv every key", func(c *Claims) { c.Cap.KV = []KVScope{{Keys: "*", Mode: "r"}} }, "kv"},
		{"kv prefix shorter", func(c *Claims) { c.Cap.KV = []KVScope{{Keys: "a*", Mode: "r"}} }, "kv"},
		{"kv mode upgraded", func(c *Claims) { c.Cap.KV = []KVScope{{Keys: "shared/x", Mode: "rw"}} }, "kv"},
		{"kv exact key is not its prefix", func(c *Claims) { c.Cap.KV = []KVScope{{Keys: "motd*", Mode: "r"}} }, "kv"},
		{"name made explicit under a wildcard", func(c *Claims) { c.Cap.Net = []string{"a.example.com"} }, "net"},
		{"apex of a wildcard", func(c *Claims) { c.Cap.Net = []string{"example.com"} }, "net"},
		{"suffix trick", func(c *Claims) { c.Cap.Net = []string{"evilexample.com"} }, "net"},
		{"port dropped", func(c *Claims) { c.Cap.Net = []string{"api.other.org"} }, "net"},
		{"other port", func(c *Claims) { c.Cap.Net = []string{"api.other.org:80"} }, "net"},
		{"any host", func(c *Claims) { c.Cap.Net = []string{"*"} }, "net"},
		{"ip outside", func(c *Claims) { c.Cap.Net = []string{"192.0.2.2"} }, "net"},
		{"budget beyond", func(c *Claims) { c.Cap.Budgets[BudgetCalls] = 101 }, "budgets"},
		{"budget dropped", func(c *Claims) { delete(c.Cap.Budgets, BudgetNetBytes) }, "budgets"},
		{"autonomy raised", func(c *Claims) { c.Cap.Autonomy = "autopilot" }, "autonomy"},
		{"autonomy emptied", func(c *Claims) { c.Cap.Autonomy = "" }, "autonomy"},
		{"outlives parent", func(c *Claims) { c.Expiry = c.Expiry.Add(time.Second) }, "exp"},
		{"valid earlier", func(c *Claims) { c.NotBefore = c.NotBefore.Add(-time.Second) }, "nbf"},
		{"approver role", func(c *Claims) { c.Cap.Role = RoleApprover }, "role"},
		{"handles added", func(c *Claims) { c.Cap.Handles = true }, ""},
		{"other parent", func(c *Claims) { c.Cap.Parent = "X"; c.Cap.Ancestors[1].ID = "X" }, "ancestors"},
		{"chain rewritten", func(c *Claims) { c.Cap.Ancestors[0].ID = "Z" }, "ancestors"},
		{"chain dropped", func(c *Claims) { c.Cap.Ancestors = c.Cap.Ancestors[1:] }, "ancestors"},
		// The ancestors' fs roots keep their read-only paths read-only at
		// every call (the kernel's workspace); a child cannot shed them.
		{"the parent's fs roots dropped", func(c *Claims) { c.Cap.Ancestors[1].FS = nil }, "ancestors"},
		{"the parent's read-only root dropped", func(c *Claims) {
			c.Cap.Ancestors[1].FS = []FSRoot{{Path: "/srv/work", Mode: "rw"}, {Path: "/srv/ref", Mode: "r"}}
		}, "ancestors"},
		{"the parent's read-only root made writable", func(c *Claims) { c.Cap.Ancestors[1].FS[1].Mode = "rw" }, "ancestors"},
		{"a grandparent's fs roots dropped", func(c *Claims) { c.Cap.Ancestors[0].FS = nil }, "ancestors"},
		{"the parent's fs roots with a base", func(c *Claims) { c.Cap.Ancestors[1].FS[0].Base = "/srv/work" }, "ancestors"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			child := ok()
			c.edit(&child)
			err := Narrows(parent, child)
			var we *WideningError
			switch {
			case c.field == "" && err != nil:
				t.Fatalf("Narrows = %v, want nil", err)
			case c.field != "" && (!errors.As(err, &we) || we.Field != c.field):
				t.Fatalf("Narrows = %v, want a widening of %s", err, c.field)
			}
		})
	}
}

func TestNarrowsHandleMode(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	parent := Claims{Subject: "a", Audience: "k", ID: "P", IssuedAt: t0, NotBefore: t0, Expiry: t0.Add(time.Hour),
		Cap: Capability{Tools: []string{"*"}, Handles: true}}
	child := parent.clone()
	child.ID, child.Cap.Parent, child.Cap.Ancestors, child.Cap.Handles = "C", "P", []Ancestor{{ID: "P"}}, false
	var we *WideningError
	if err := Narrows(parent, child); !errors.As(err, &we) || we.Field != "handles" {
		t.Fatalf("leaving handle mode: Narrows = %v", err)
	}
}

func TestNarrowsDepth(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	parent := Claims{Subject: "a", Audience: "k", ID: "P", IssuedAt: t0, NotBefore: t0, Expiry: t0.Add(time.Hour),
		Cap: Capability{Tools: []string{"*"}}}
	for i := range MaxChainDepth {
		parent.Cap.Ancestors = append(parent.Cap.Ancestors, Ancestor{ID: string(rune('A' + i))})
	}
	parent.Cap.Parent = parent.Cap.Ancestors[MaxChainDepth-1].ID
	child := parent.clone()
	child.ID, child.Cap.Parent = "C", "P"
	child.Cap.Ancestors = append(child.Cap.Ancestors, Ancestor{ID: "P"})
	var we *WideningError
	if err := Narrows(parent, child); !errors.As(err, &we) || we.Field != "ancestors" {
		t.Fatalf("a chain of %d: Narrows = %v, want the depth refused", MaxChainDepth+1, err)
	}
	if err := child.Validate(); err == nil {
		t.Fatal("Validate accepts a chain beyond MaxChainDepth")
	}
}

// Under "*", only wildcard patterns may be delegated: an explicitly named
// host would let the SSRF guards admit private addresses for it.
func TestCoversHostNamedUnderAny(t *testing.T) {
	cases := []struct {
		child string
		ok    bool
	}{
		{"*", true}, {"*.example.com", true}, {"*.example.com:443", true},
		{"api.example.com", false}, {"10.0.0.1", false}, {"[::1]:80", false},
	}
	for _, c := range cases {
		got, err := coversHost([]string{"*"}, c.child)
		if err != nil || got != c.ok {
			t.Errorf("coversHost([*], %q) = %v, %v; want %v", c.child, got, err, c.ok)
		}
	}
}

// TestAllowsKey: kv scopes match keys exactly or by prefix, and grant
// writing only with mode rw; a token without scopes reaches no key.
func TestAllowsKey(t *testing.T) {
	c := Capability{KV: []KVScope{{Keys: "a/*", Mode: "rw"}, {Keys: "motd", Mode: "r"}, {Keys: "pub*", Mode: "r"}}}
	for _, tt := range []struct {
		key   string
		write bool
		want  bool
	}{
		{"a/x", false, true}, {"a/x", true, true}, {"a/", true, true}, {"a", false, false}, {"ab/x", false, false},
		{"motd", false, true}, {"motd", true, false}, {"motd2", false, false},
		{"pub", false, true}, {"public/x", false, true}, {"public/x", true, false}, {"b/x", false, false},
	} {
		if got := c.AllowsKey(tt.key, tt.write); got != tt.want {
			t.Errorf("AllowsKey(%q, write=%v) = %v, want %v", tt.key, tt.write, got, tt.want)
		}
	}
	if (Capability{}).AllowsKey("a/x", false) {
		t.Error("a token without kv scopes reaches a key")
	}
	if !(Capability{KV: []KVScope{{Keys: "*", Mode: "r"}}}).AllowsKey("anything", false) {
		t.Error(`"*" does not match every key`)
	}
	for _, bad := range []KVScope{{Keys: "", Mode: "r"}, {Keys: "a*b", Mode: "r"}, {Keys: "a\x00", Mode: "r"}, {Keys: "a", Mode: "w"}} {
		if validKVScope(bad) == nil {
			t.Errorf("kv scope %+v accepted", bad)
		}
	}
}

// TestAsAncestor: a parent carries its fs roots, without bases, to its
// children when one of them is read-only (its writable ones too: they
// are the exceptions inside the read-only ones), and none otherwise.
func TestAsAncestor(t *testing.T) {
	for _, c := range []struct {
		name string
		fs   []FSRoot
		want []FSRoot
	}{
		{"no roots", nil, nil},
		{"all writable", []FSRoot{{Path: "/a", Mode: "rw"}, {Path: "/b", Mode: "rw", Base: "/b"}}, nil},
		{"a read-only root", []FSRoot{{Path: "/a", Mode: "rw", Base: "/"}, {Path: "/a/ro", Mode: "r", Base: "/"}},
			[]FSRoot{{Path: "/a", Mode: "rw"}, {Path: "/a/ro", Mode: "r"}}},
		{"a writable root inside a read-only one", []FSRoot{{Path: "/a", Mode: "r"}, {Path: "/a/w", Mode: "rw"}},
			[]FSRoot{{Path: "/a", Mode: "r"}, {Path: "/a/w", Mode: "rw"}}},
	} {
		p := Claims{ID: "P", Cap: Capability{FS: c.fs, Budgets: map[string]int64{BudgetCalls: 3}}}
		a := AsAncestor(p)
		if a.ID != "P" || a.Budgets[BudgetCalls] != 3 || !slices.Equal(a.FS, c.want) {
			t.Errorf("%s: AsAncestor = %+v, want fs %v", c.name, a, c.want)
		}
		if len(c.fs) > 0 && a.FS != nil && &a.FS[0] == &p.Cap.FS[0] {
			t.Errorf("%s: AsAncestor shares the parent's fs slice", c.name)
		}
	}
}
