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
	"autonomy_mode": modes[max([rank[f.mode] | some f in findings])],
	"risk_score": max([f.risk | some f in findings]),
	"risk_basis": sort([f.basis | some f in findings]),
	"net_full": net_full,
}

# net_full lets proc.exec use the host's network ("full" posture). The
# kernel also requires the token's net pattern "*"; this policy requires
# both that and data.capkernel.config.allow_net_full.
default net_full := false

net_full if {
	input.network.posture == "full"
	"*" in input.network.patterns
	object.get(data.capkernel.config, "allow_net_full", false) == true
}

findings contains {"mode": "escalated", "risk": 0.9, "basis": "full network access asked for but not allowed"} if {
	input.network.posture == "full"
	not net_full
}

findings contains {"mode": m, "risk": 0.5, "basis": sprintf("network posture %s", [input.network.posture])} if {
	input.network.posture == "allowlist"
	m := class_mode
}

findings contains {"mode": "autopilot", "risk": 0.05, "basis": "no side effects"} if class == "NONE"

findings contains {"mode": "autopilot", "risk": 0.1, "basis": "read in scope"} if class == "READ"

findings contains {"mode": "autopilot", "risk": 0.3, "basis": "write in scope"} if class == "WRITE"

# EXECUTE and NETWORK calls need an approval (soft_gate) unless
# data.capkernel.config.class_modes names another mode for the class.
findings contains {"mode": class_mode, "risk": 0.7, "basis": sprintf("%s syscall", [lower(class)])} if {
	class in {"EXECUTE", "NETWORK"}
}

class_mode := object.get(object.get(data.capkernel.config, "class_modes", {}), class, "soft_gate")

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

# fs_paths are the names a resource goes by: as given and as resolved.
fs_paths(r) := {p | some p in [object.get(r, "path", ""), object.get(r, "real_path", "")]; p != ""}

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
	some s in data.capkernel.config.sensitive_paths
	endswith(s, "/")
	startswith(concat("", [p, "/"]), s)
}

sensitive_path(p) if {
	some s in data.capkernel.config.sensitive_paths
	not endswith(s, "/")
	p == s
}
