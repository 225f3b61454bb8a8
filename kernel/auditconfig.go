package kernel

import (
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/capkernel/capkernel/captoken"
)

// AuditConfig is kernel.json's "audit" section: how much of each call's
// payload (arguments, result, policy input, context) the kernel keeps
// beside the commitments in its audit records, and for how long.
//
//	"audit": {
//	  "depth": {"fs.write": "commitments_only", "proc.*": "full"},
//	  "retention": [{"older_than": "720h"}, {"older_than": "24h", "tool": "fs.read"},
//	                {"older_than": "1h", "agent": "scratch-agent"}],
//	  "retention_interval": "1h"
//	}
type AuditConfig struct {
	// Depth maps tool id patterns ("fs.write", "fs.*", "*") to a depth:
	// DepthFull (the default) keeps every part; DepthCommitmentsOnly keeps
	// none, nor the salt. The most specific pattern wins: an exact id,
	// then the longest glob.
	Depth map[string]string `json:"depth,omitempty"`
	// Retention rules erase payloads older than a duration, of the tools
	// or the agent a rule names (all when it names neither). Each run
	// appends one erasure record per rule that erased something.
	Retention []RetentionRule `json:"retention,omitempty"`
	// RetentionInterval is how often the rules run (Go duration; default
	// "1h"); they also run once when the kernel opens.
	RetentionInterval string `json:"retention_interval,omitempty"`
}

// RetentionRule erases the payloads of audit records older than OlderThan
// whose tool matches Tool (a pattern as in AuditConfig.Depth) and whose
// agent is Agent or one of its sub-agents (Agent/…); an empty Tool or
// Agent matches every one. A record of a call whose token did not verify
// is taken for the agent its envelope claimed (claimed_agent_id). A
// record of a call by handle refused before the handle resolved names no
// tool: every Tool pattern matches it.
type RetentionRule struct {
	OlderThan string `json:"older_than"` // Go duration, e.g. "720h"
	Tool      string `json:"tool,omitempty"`
	Agent     string `json:"agent,omitempty"`
}

// DefaultRetentionInterval is how often retention runs unless
// audit.retention_interval says otherwise.
const DefaultRetentionInterval = time.Hour

// auditPolicy is an AuditConfig checked and parsed.
type auditPolicy struct {
	depth     map[string]string
	retention []retention
	interval  time.Duration
}

type retention struct {
	RetentionRule
	age time.Duration
}

// parse checks c: known depths, valid patterns, positive durations. A nil
// c keeps every payload forever.
func (c *AuditConfig) parse() (*auditPolicy, error) {
	p := &auditPolicy{interval: DefaultRetentionInterval}
	if c == nil {
		return p, nil
	}
	p.depth = c.Depth
	for pat, d := range c.Depth {
		if _, err := path.Match(pat, ""); err != nil {
			return nil, fmt.Errorf("audit.depth: pattern %q: %v", pat, err)
		}
		if d != DepthFull && d != DepthCommitmentsOnly {
			return nil, fmt.Errorf("audit.depth[%q]: %q is not %q or %q", pat, d, DepthFull, DepthCommitmentsOnly)
		}
	}
	for i, r := range c.Retention {
		age, err := time.ParseDuration(r.OlderThan)
		if err != nil || age <= 0 {
			return nil, fmt.Errorf("audit.retention[%d].older_than: %q is not a positive duration such as \"720h\"", i, r.OlderThan)
		}
		if _, err := path.Match(r.Tool, ""); err != nil {
			return nil, fmt.Errorf("audit.retention[%d].tool: pattern %q: %v", i, r.Tool, err)
		}
		p.retention = append(p.retention, retention{RetentionRule: r, age: age})
	}
	if c.RetentionInterval != "" {
		d, err := time.ParseDuration(c.RetentionInterval)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("audit.retention_interval: %q is not a positive duration", c.RetentionInterval)
		}
		p.interval = d
	}
	return p, nil
}

// depthOf returns the depth of tool's payloads.
func (p *auditPolicy) depthOf(tool string) string {
	if p == nil {
		return DepthFull
	}
	if d, ok := p.depth[tool]; ok {
		return d
	}
	best, depth := -1, DepthFull
	for pat, d := range p.depth {
		if ok, _ := path.Match(pat, tool); ok && len(pat) > best {
			best, depth = len(pat), d
		}
	}
	return depth
}

// strictest is the strictest depth p sets for any tool: commitments_only
// if a pattern says so, else full.
func (p *auditPolicy) strictest() string {
	if p != nil {
		for _, d := range p.depth {
			if d == DepthCommitmentsOnly {
				return d
			}
		}
	}
	return DepthFull
}

// matches reports whether rule r covers a record of tool and agent: a
// rule's agent covers its sub-agents (agent/…, captoken.SubAgent), whose
// tokens were attenuated from its own.
func (r retention) matches(tool, agent string) bool {
	if r.Agent != "" && !captoken.SubAgent(r.Agent, agent) {
		return false
	}
	if r.Tool == "" || tool == "" || strings.HasPrefix(tool, HandlePrefix) {
		// A call by a handle refused before the handle resolved is
		// recorded under the handle (so its record reveals no tool), one
		// whose envelope did not decode as far as its tool id under
		// none: every tool rule covers them, erring towards erasing.
		return true
	}
	ok, _ := path.Match(r.Tool, tool)
	return ok
}

// depthOf returns the depth of tool's payloads under the kernel's config.
func (k *Kernel) depthOf(tool string) string { return k.audit.depthOf(tool) }
