# The default capkernel policy. The kernel queries data.capkernel.decision
# with the input document of docs/policy.md and applies the strictest of
# the decided mode, the caller's requested mode and the token's ceiling.
package capkernel

modes := ["autopilot", "soft_gate", "escalated", "no_go"]

rank := {"autopilot": 0, "soft_gate": 1, "escalated": 2, "no_go": 3}

known_classes := {"NONE", "READ", "WRITE", "EXECUTE", "NETWORK"}

# class is the side-effect class; a missing one is unknown, never skipped.
class := object.get(input, "side_effect", "")

# The decision: the strictest mode any finding asks for, the highest risk,
# and every finding's reason. No finding means no decision, which the
# kernel treats as no_go.
decision := {
	"autonomy_mode": mode,
	"risk_score": max([f.risk | some f in checked_findings]),
	"risk_basis": sort([f.basis | some f in checked_findings]),
	"net_full": net_full,
	"session_confirm": session_confirm,
}

mode := modes[max([rank[f.mode] | some f in checked_findings])]

# A finding is {"mode": one of modes, "risk": a number in [0,1], "basis": a
# string}. One that is not (a confirmation setting such as "deny" or a
# misspelling for its mode, a member missing or of another type) is a
# mistake in a rule; left to the comprehensions above it would drop out of
# the mode but not of the risk and basis, and the call would run on the
# other findings. It refuses the call instead, naming it.
valid_finding(f) if {
	rank[f.mode]
	is_number(f.risk)
	f.risk >= 0
	f.risk <= 1
	is_string(f.basis)
}

checked_findings contains f if {
	some f in findings
	valid_finding(f)
}

checked_findings contains {"mode": "no_go", "risk": 1.0, "basis": sprintf("malformed finding %v: a finding is {\"mode\": one of %v, \"risk\": a number in [0,1], \"basis\": a string}", [f, modes])} if {
	some f in findings
	not valid_finding(f)
}

# The bundle's settings (data.json). A bundle without any keeps the
# defaults the rules below give.
default config_data := {}

config_data := data.capkernel.config

# config_errors says what is wrong with the settings' shape: a value of a
# type the rules below cannot read would make a rule undefined and so
# switch it off (sensitive_paths as one string, not a list, matches no
# path; a misspelt member is not read at all). The kernel evaluates
# config_errors once, when it loads the bundle, and refuses a bundle that
# has any (policy.ConfigErrorsQuery): the data cannot change after that,
# so the rule is not a finding, which would evaluate it on every call.
config_errors contains sprintf("config is %s, not an object", [shape(config_data)]) if not is_object(config_data)

config_errors contains sprintf("config.sensitive_paths is %s, not a list of strings", [shape(x)]) if {
	x := config_data.sensitive_paths
	not strings_list(x)
}

config_errors contains sprintf("config.allow_net_full is %s, not a boolean", [shape(x)]) if {
	x := config_data.allow_net_full
	not is_boolean(x)
}

config_errors contains sprintf("config.confirmation is %s, not an object", [shape(x)]) if {
	x := config_data.confirmation
	not is_object(x)
}

# What each member of confirmation holds.
confirmation_members := {
	"default": "a setting for each class",
	"per_tool": "a setting for each tool id",
	"trusted_workspaces": "a list of directories",
	"trusted_workspace_overrides": "a setting for each class",
	"undeclared": "a setting",
	"session": "true or false for each class",
}

config_errors contains sprintf("config.confirmation has the member %q, not one of %v", [k, sort(object.keys(confirmation_members))]) if {
	some k, _ in confirmation
	not confirmation_members[k]
}

config_errors contains sprintf("config.confirmation.%s is %s, not an object (%s)", [k, shape(x), confirmation_members[k]]) if {
	some k in ["default", "per_tool", "trusted_workspace_overrides", "session"]
	x := confirmation[k]
	not is_object(x)
}

config_errors contains sprintf("config.confirmation.%s names the class %q, not one of %v", [k, name, sort(known_classes)]) if {
	some k in ["default", "trusted_workspace_overrides", "session"]
	is_object(confirmation[k])
	some name, _ in confirmation[k]
	not known_classes[name]
}

config_errors contains sprintf("config.confirmation.%s[%q] is %s, not one of %v", [k, name, shape(x), sort(object.keys(confirm_modes))]) if {
	some k in ["default", "per_tool", "trusted_workspace_overrides"]
	is_object(confirmation[k])
	some name, x in confirmation[k]
	not confirm_modes[x]
}

config_errors contains sprintf("config.confirmation.session[%q] is %s, not a boolean", [name, shape(x)]) if {
	is_object(confirmation.session)
	some name, x in confirmation.session
	not is_boolean(x)
}

config_errors contains sprintf("config.confirmation.undeclared is %s, not one of %v", [shape(x), sort(object.keys(confirm_modes))]) if {
	x := confirmation.undeclared
	not confirm_modes[x]
}

config_errors contains sprintf("config.confirmation.trusted_workspaces is %s, not a list of strings", [shape(x)]) if {
	x := confirmation.trusted_workspaces
	not strings_list(x)
}

strings_list(x) if {
	is_array(x)
	every s in x {
		is_string(s)
	}
}

# shape names a value for an error: its JSON type, and the value itself
# when it is not an array or an object.
shape(x) := sprintf("an %s", [type_name(x)]) if {
	type_name(x) in {"array", "object"}
} else := sprintf("the %s %s", [type_name(x), json.marshal(x)])

# session_confirm lets the human at the agent's own client decide a
# soft_gate call (MCP elicitation: `kernelctl mcp` asks the user through
# the client) instead of an approver. It is off unless the class is named
# in data.capkernel.config.confirmation.session (an operator who trusts
# the client to put the question to a person, not to the agent, opts in),
# and never for a call any finding escalates or forbids, nor for a write
# under a sensitive path or a secret, which keep their approver. The
# kernel also refuses it for anything but a final soft_gate.
default session_confirm := false

session_confirm if {
	mode == "soft_gate"
	object.get(object.get(confirmation, "session", {}), class, false) == true
	not touches_sensitive
}

touches_sensitive if {
	some r in input.resources
	r.kind == "fs"
	r.op in {"write", "delete"}
	some p in fs_paths(r)
	sensitive_path(p)
}

# net_full lets proc.exec use the host's network ("full" posture). The
# kernel also requires the token's net pattern "*"; this policy requires
# both that and data.capkernel.config.allow_net_full.
default net_full := false

net_full if {
	input.network.posture == "full"
	"*" in input.network.patterns
	object.get(config_data, "allow_net_full", false) == true
}

findings contains {"mode": "escalated", "risk": 0.9, "basis": "full network access asked for but not allowed"} if {
	input.network.posture == "full"
	not net_full
}

findings contains {"mode": m, "risk": 0.5, "basis": sprintf("network posture %s", [input.network.posture])} if {
	input.network.posture == "allowlist"
	m := confirm_modes[setting]
}

# Every call of a known class gets the class's risk and the mode its
# confirmation setting asks for (see confirmation below).
findings contains {"mode": confirm_modes[setting], "risk": class_risk[class], "basis": class_basis[class]} if {
	known_classes[class]
	confirm_modes[setting]
}

findings contains {"mode": "no_go", "risk": 1.0, "basis": sprintf("unknown confirmation setting %q for %s", [setting, input.tool_id])} if {
	known_classes[class]
	not confirm_modes[setting]
}

class_risk := {"NONE": 0.05, "READ": 0.1, "WRITE": 0.3, "EXECUTE": 0.7, "NETWORK": 0.7}

class_basis := {
	"NONE": "no side effects",
	"READ": "read in scope",
	"WRITE": "write in scope",
	"EXECUTE": "execute syscall",
	"NETWORK": "network syscall",
}

# Confirmation settings (seed 002 §5.2) live in data.capkernel.config.
# confirmation, so the policy hash covers them: auto runs the call, prompt
# waits for an approver (soft_gate), escalate for an approver with the
# escalation role, deny refuses it. The setting of a call is its tool's
# per_tool entry; else, when every file it touches lies in a trusted
# workspace, the class's trusted_workspace_overrides entry or auto; else
# the class's default entry, or builtin_setting's.
confirm_modes := {"auto": "autopilot", "prompt": "soft_gate", "escalate": "escalated", "deny": "no_go"}

# The confirmation settings; {} when config is no object (config_errors
# says so).
default confirmation := {}

confirmation := object.get(config_data, "confirmation", {}) if is_object(config_data)

setting := s if {
	s := confirmation.per_tool[input.tool_id]
} else := s if {
	in_trusted_workspace
	s := object.get(object.get(confirmation, "trusted_workspace_overrides", {}), class, "auto")
} else := object.get(object.get(confirmation, "default", {}), class, builtin_setting[class])

# builtin_setting applies to a class the data does not name.
builtin_setting := {"NONE": "auto", "READ": "auto", "WRITE": "auto", "EXECUTE": "prompt", "NETWORK": "prompt"}

in_trusted_workspace if {
	files := [r | some r in input.resources; r.kind == "fs"]
	count(files) > 0
	every r in files {
		some w in object.get(confirmation, "trusted_workspaces", [])
		within(concat("/", [r.root, object.get(r, "real_path", r.path)]), w)
	}
}

within(p, w) if p == w

within(p, w) if startswith(p, concat("", [trim_suffix(w, "/"), "/"]))

findings contains {"mode": "no_go", "risk": 1.0, "basis": sprintf("unknown side-effect class: %q", [class])} if {
	not known_classes[class]
}

# Secrets are off limits to every syscall, whatever it does with them.
findings contains {"mode": "no_go", "risk": 1.0, "basis": sprintf("secret path: %s", [p])} if {
	some r in input.resources
	r.kind == "fs"
	some p in fs_paths(r)
	secret_path(p)
}

findings contains {"mode": "soft_gate", "risk": 0.6, "basis": sprintf("write under sensitive path: %s", [p])} if {
	some r in input.resources
	r.kind == "fs"
	r.op in {"write", "delete"}
	some p in fs_paths(r)
	sensitive_path(p)
}

findings contains {"mode": "escalated", "risk": 0.8, "basis": sprintf("delete of a directory: %s", [r.path])} if {
	some r in input.resources
	r.kind == "fs"
	r.op == "delete"
	r.is_dir
}

# fs_paths are the names a resource goes by: as given, as resolved, and
# as seen from every other root of the token that holds it (nested roots).
fs_paths(r) := {p |
	some p in array.concat([object.get(r, "path", ""), object.get(r, "real_path", "")], object.get(r, "other_paths", []))
	p != ""
}

secret_path(p) if {
	some c in split(p, "/")
	secret_component(c)
}

secret_component(c) if c in {".env", ".ssh", ".aws", ".gnupg"}

secret_component(c) if startswith(c, ".env.")

secret_component(c) if endswith(c, ".pem")

secret_component(c) if {
	some prefix in {"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"}
	startswith(c, prefix)
}

# A sensitive entry ending in "/" covers that directory and everything in
# it; any other entry is one file. Both match from the start of the path
# relative to the root.
sensitive_path(p) if {
	some s in config_data.sensitive_paths
	endswith(s, "/")
	startswith(concat("", [p, "/"]), s)
}

sensitive_path(p) if {
	some s in config_data.sensitive_paths
	not endswith(s, "/")
	p == s
}

# An upstream MCP tool that no declaration covers (docs/mcp.md): the
# kernel cannot see which files, hosts or keys it touches, so whatever its
# class claims it is an opaque effect. It takes confirmation.undeclared
# (default prompt: an approver decides), unless per_tool names the tool,
# which is the operator's explicit word for it.
undeclared_setting := object.get(confirmation, "undeclared", "prompt")

findings contains {"mode": confirm_modes[undeclared_setting], "risk": 0.6, "basis": "upstream tool with undeclared resources: an opaque effect"} if {
	input.resources_undeclared == true
	not confirmation.per_tool[input.tool_id]
	confirm_modes[undeclared_setting]
}

findings contains {"mode": "no_go", "risk": 1.0, "basis": sprintf("unknown confirmation setting %q for undeclared upstream tools", [undeclared_setting])} if {
	input.resources_undeclared == true
	not confirmation.per_tool[input.tool_id]
	not confirm_modes[undeclared_setting]
}

# Rules that decide on a call's args must see them. The kernel leaves args
# over 16 KiB out of the input and says so (args_omitted, args_size), and
# the agent chooses their size: a rule on the args would simply not fire
# on a call whose args were padded. A bundle that adds a rule reading
# input.args names the tools it reads them of in args_tools (data:
# config.args_tools, or rules `args_tools contains "echo"`; "*" for
# every tool), and a call of one of them whose args were left out is
# escalated: an approver sees the args the policy could not.
args_tools contains t if {
	some t in object.get(config_data, "args_tools", [])
}

findings contains {"mode": "escalated", "risk": 0.8, "basis": sprintf("args of %v bytes left out of the policy input, and a rule reads the args of %s", [object.get(input, "args_size", "?"), input.tool_id])} if {
	input.args_omitted == true
	some t in {input.tool_id, "*"}
	args_tools[t]
}

config_errors contains sprintf("config.args_tools is %s, not a list of strings", [shape(x)]) if {
	x := config_data.args_tools
	not strings_list(x)
}
