package capkernel_test

import data.capkernel

fs(op, path) := {"kind": "fs", "op": op, "path": path, "real_path": path}

call(class, resources) := {"tool_id": "t", "side_effect": class, "resources": resources, "agent_id": "a"}

decide(doc) := d if {
	d := capkernel.decision with input as doc
}

test_read_in_scope_is_autopilot if {
	d := decide(call("READ", [fs("read", "src/main.go")]))
	d.autonomy_mode == "autopilot"
	d.risk_score == 0.1
	d.risk_basis == ["read in scope"]
}

test_none_is_autopilot if decide(call("NONE", [])).autonomy_mode == "autopilot"

test_write_in_scope_is_autopilot if {
	d := decide(call("WRITE", [fs("write", "notes.txt")]))
	d.autonomy_mode == "autopilot"
	d.risk_score == 0.3
}

test_write_under_sensitive_dir_is_soft_gate if {
	d := decide(call("WRITE", [fs("write", ".git/config")]))
	d.autonomy_mode == "soft_gate"
	"write under sensitive path: .git/config" in d.risk_basis
}

test_write_to_sensitive_file_is_soft_gate if decide(call("WRITE", [fs("write", "Makefile")])).autonomy_mode == "soft_gate"

test_sensitive_match_is_anchored if {
	decide(call("WRITE", [fs("write", "docs/Makefile")])).autonomy_mode == "autopilot"
	decide(call("WRITE", [fs("write", "x.git/config")])).autonomy_mode == "autopilot"
	decide(call("WRITE", [fs("write", ".gitignore")])).autonomy_mode == "autopilot"
}

test_sensitive_dir_itself if decide(call("WRITE", [fs("delete", ".git")])).autonomy_mode == "soft_gate"

# A file seen from another root of the token that holds it (nested roots)
# is matched there too: app/.git/config is .git/config in the root app.
test_sensitive_in_another_root if {
	r := object.union(fs("write", "app/.git/config"), {"other_paths": [".git/config"]})
	decide(call("WRITE", [r])).autonomy_mode == "soft_gate"
	s := object.union(fs("write", "config"), {"other_paths": [".ssh/config"]})
	decide(call("WRITE", [s])).autonomy_mode == "no_go"
}

test_reading_sensitive_path_is_autopilot if decide(call("READ", [fs("read", ".git/config")])).autonomy_mode == "autopilot"

test_sensitive_via_real_path if {
	r := {"kind": "fs", "op": "write", "path": "link/config", "real_path": ".git/config"}
	decide(call("WRITE", [r])).autonomy_mode == "soft_gate"
}

test_delete_of_directory_is_escalated if {
	r := object.union(fs("delete", "build"), {"is_dir": true})
	d := decide(call("WRITE", [r]))
	d.autonomy_mode == "escalated"
	d.risk_score == 0.8
}

test_delete_of_file_is_autopilot if decide(call("WRITE", [fs("delete", "build/out.o")])).autonomy_mode == "autopilot"

test_secrets_are_no_go_for_every_op if {
	every op in ["read", "list", "stat", "write", "delete"] {
		every p in [".env", ".env.local", "config/.env", "certs/server.pem", ".ssh/id_rsa", "id_rsa.pub", "home/.aws/credentials", ".gnupg", "keys/id_ed25519"] {
			d := decide(call("READ", [fs(op, p)]))
			d.autonomy_mode == "no_go"
			d.risk_score == 1.0
		}
	}
}

test_secret_via_real_path if {
	r := {"kind": "fs", "op": "read", "path": "notes.txt", "real_path": ".env"}
	decide(call("READ", [r])).autonomy_mode == "no_go"
}

test_secret_lookalikes_are_not_secrets if {
	every p in ["my.envelope", "environment.txt", "env", ".envrc", "pem", "cert.pem.md", "rsa_id", "ssh/config", "aws.txt", "docs/gnupg.md"] {
		decide(call("READ", [fs("read", p)])).autonomy_mode == "autopilot"
	}
}

test_secret_in_any_resource if {
	d := decide(call("WRITE", [fs("write", "ok.txt"), fs("stat", ".env")]))
	d.autonomy_mode == "no_go"
}

test_execute_and_network_are_soft_gate if {
	decide(call("EXECUTE", [])).autonomy_mode == "soft_gate"
	decide(call("NETWORK", [])).autonomy_mode == "soft_gate"
}

test_unknown_class_is_no_go if {
	d := decide(call("TELEPORT", []))
	d.autonomy_mode == "no_go"
	`unknown side-effect class: "TELEPORT"` in d.risk_basis
}

test_missing_class_is_no_go if decide({"tool_id": "t", "resources": []}).autonomy_mode == "no_go"

test_basis_lists_every_finding if {
	r := object.union(fs("delete", ".git"), {"is_dir": true})
	d := decide(call("WRITE", [r]))
	d.autonomy_mode == "escalated"
	count(d.risk_basis) == 3
}

# Confirmation settings come from data, so policy_hash covers them.

rooted(op, root, path) := {"kind": "fs", "op": op, "root": root, "path": path, "real_path": path}

conf := {
	"default": {"NONE": "auto", "READ": "auto", "WRITE": "prompt", "EXECUTE": "prompt"},
	"per_tool": {"git.status": "auto", "fs.delete": "escalate", "net.post": "deny"},
	"trusted_workspaces": ["/srv/trusted"],
	"trusted_workspace_overrides": {"EXECUTE": "prompt"},
}

mode_with(doc, c) := m if {
	m := capkernel.decision.autonomy_mode with input as doc with data.capkernel.config.confirmation as c
}

test_confirmation_defaults_by_class if {
	mode_with(call("READ", [rooted("read", "/srv/ws", "a")]), conf) == "autopilot"
	mode_with(call("WRITE", [rooted("write", "/srv/ws", "a")]), conf) == "soft_gate"
	mode_with(call("EXECUTE", []), conf) == "soft_gate"
}

test_confirmation_class_without_default_takes_the_builtin if {
	mode_with(call("NETWORK", []), conf) == "soft_gate"
	mode_with(call("READ", []), {}) == "autopilot"
	mode_with(call("EXECUTE", []), {}) == "soft_gate"
}

test_confirmation_per_tool_wins if {
	mode_with(object.union(call("EXECUTE", []), {"tool_id": "git.status"}), conf) == "autopilot"
	mode_with(object.union(call("WRITE", [rooted("delete", "/srv/ws", "a")]), {"tool_id": "fs.delete"}), conf) == "escalated"
	mode_with(object.union(call("NETWORK", []), {"tool_id": "net.post"}), conf) == "no_go"
}

test_trusted_workspace_lowers_the_bar if {
	mode_with(call("WRITE", [rooted("write", "/srv/trusted", "src/a.go")]), conf) == "autopilot"
	mode_with(call("EXECUTE", [rooted("read", "/srv/trusted", "x")]), conf) == "soft_gate"
}

test_trusted_workspace_needs_every_file_inside if {
	mode_with(call("WRITE", [rooted("write", "/srv/trusted", "a"), rooted("write", "/srv/ws", "b")]), conf) == "soft_gate"
	mode_with(call("WRITE", [rooted("write", "/srv/trusted-not", "a")]), conf) == "soft_gate"
}

test_confirmation_cannot_lower_secrets_or_sensitive_paths if {
	mode_with(object.union(call("READ", [rooted("read", "/srv/trusted", ".env")]), {"tool_id": "git.status"}), conf) == "no_go"
	mode_with(call("WRITE", [rooted("write", "/srv/trusted", ".git/config")]), conf) == "soft_gate"
}

test_unknown_confirmation_setting_is_no_go if {
	mode_with(call("READ", []), {"default": {"READ": "sometimes"}}) == "no_go"
}

exec_call(posture, patterns) := object.union(call("EXECUTE", []), {"network": {"posture": posture, "patterns": patterns}})

test_execute_and_network_are_soft_gate_by_default if {
	decide(call("EXECUTE", [])).autonomy_mode == "soft_gate"
	decide(call("NETWORK", [])).autonomy_mode == "soft_gate"
	decide(call("EXECUTE", [])).net_full == false
}

test_confirmation_setting_lets_execute_run_unattended if {
	cfg := object.union(data.capkernel.config, {"confirmation": {"default": {"EXECUTE": "auto"}}})
	d := capkernel.decision with input as call("EXECUTE", []) with data.capkernel.config as cfg
	d.autonomy_mode == "autopilot"
	n := capkernel.decision with input as call("NETWORK", []) with data.capkernel.config as cfg
	n.autonomy_mode == "soft_gate"
}

test_net_full_needs_star_and_config if {
	allow := object.union(data.capkernel.config, {"allow_net_full": true, "confirmation": {"default": {"EXECUTE": "auto"}}})
	ok := capkernel.decision with input as exec_call("full", ["*"]) with data.capkernel.config as allow
	ok.net_full == true
	ok.autonomy_mode == "autopilot"
	no_star := capkernel.decision with input as exec_call("full", ["api.example.com"]) with data.capkernel.config as allow
	no_star.net_full == false
	no_star.autonomy_mode == "escalated"
	default_cfg := decide(exec_call("full", ["*"]))
	default_cfg.net_full == false
	default_cfg.autonomy_mode == "escalated"
}

test_net_full_only_for_full_posture if {
	allow := object.union(data.capkernel.config, {"allow_net_full": true})
	d := capkernel.decision with input as exec_call("allowlist", ["*"]) with data.capkernel.config as allow
	d.net_full == false
	"network posture allowlist" in d.risk_basis
}

# Upstream MCP tools without a declaration are opaque effects.

upstream_call(class, undeclared) := object.union(call(class, []), {"tool_id": "mcp.fs.read_text_file", "resources_undeclared": undeclared})

test_undeclared_upstream_tool_is_soft_gate_whatever_its_class if {
	every class in ["NONE", "READ", "WRITE"] {
		d := decide(upstream_call(class, true))
		d.autonomy_mode == "soft_gate"
		"upstream tool with undeclared resources: an opaque effect" in d.risk_basis
	}
}

test_declared_upstream_tool_follows_its_class if {
	decide(upstream_call("READ", false)).autonomy_mode == "autopilot"
	decide(object.union(call("READ", [fs("read", "a.txt")]), {"tool_id": "mcp.fs.read_text_file"})).autonomy_mode == "autopilot"
}

test_declared_upstream_secret_is_no_go if {
	d := decide(object.union(call("READ", [fs("read", ".env")]), {"tool_id": "mcp.fs.read_text_file"}))
	d.autonomy_mode == "no_go"
	"secret path: .env" in d.risk_basis
}

test_undeclared_setting_and_per_tool if {
	mode_with(upstream_call("READ", true), {"undeclared": "auto"}) == "autopilot"
	mode_with(upstream_call("READ", true), {"undeclared": "deny"}) == "no_go"
	mode_with(upstream_call("READ", true), {"undeclared": "maybe"}) == "no_go"
	mode_with(upstream_call("READ", true), {"per_tool": {"mcp.fs.read_text_file": "auto"}}) == "autopilot"
	mode_with(upstream_call("READ", true), {"per_tool": {"mcp.fs.other": "auto"}}) == "soft_gate"
}

session_cfg := object.union(data.capkernel.config, {"confirmation": {"session": {"EXECUTE": true, "WRITE": true}}})

test_session_confirm_off_by_default if {
	d := decide(call("EXECUTE", []))
	d.autonomy_mode == "soft_gate"
	d.session_confirm == false
}

test_session_confirm_for_opted_in_soft_gate_class if {
	d := capkernel.decision with input as call("EXECUTE", []) with data.capkernel.config as session_cfg
	d.autonomy_mode == "soft_gate"
	d.session_confirm == true
	n := capkernel.decision with input as call("NETWORK", []) with data.capkernel.config as session_cfg
	n.autonomy_mode == "soft_gate"
	n.session_confirm == false
}

test_session_confirm_never_for_autopilot_escalated_or_sensitive if {
	auto := capkernel.decision with input as call("WRITE", [fs("write", "notes.txt")]) with data.capkernel.config as session_cfg
	auto.autonomy_mode == "autopilot"
	auto.session_confirm == false
	sens := capkernel.decision with input as call("WRITE", [fs("write", "Makefile")]) with data.capkernel.config as session_cfg
	sens.autonomy_mode == "soft_gate"
	sens.session_confirm == false
	esc := capkernel.decision with input as call("EXECUTE", [{"kind": "fs", "op": "delete", "path": "d", "is_dir": true}]) with data.capkernel.config as session_cfg
	esc.autonomy_mode == "escalated"
	esc.session_confirm == false
	sec := capkernel.decision with input as call("EXECUTE", [fs("read", ".env")]) with data.capkernel.config as session_cfg
	sec.autonomy_mode == "no_go"
	sec.session_confirm == false
}

# A finding that is not {"mode": a mode, "risk": a number in [0,1],
# "basis": a string} refuses the call, naming it: dropped from the mode
# alone, it would let the call run at autopilot with its risk and basis.
test_malformed_finding_is_no_go if {
	every f in [
		{"mode": "deny", "risk": 1.0, "basis": "deploy keys are off limits"},
		{"risk": 1.0, "basis": "no mode"},
		{"mode": "no-go", "risk": 1.0, "basis": "misspelt"},
		{"mode": "escalated", "risk": "0.9", "basis": "risk a string"},
		{"mode": "escalated", "risk": 2, "basis": "risk above 1"},
		{"mode": "escalated", "risk": 0.5, "basis": ["a list"]},
		"not an object",
	] {
		d := capkernel.decision with input as call("WRITE", [fs("write", "a")]) with capkernel.findings as {f, {"mode": "autopilot", "risk": 0.3, "basis": "write in scope"}}
		d.autonomy_mode == "no_go"
		d.risk_score == 1
		some b in d.risk_basis
		startswith(b, sprintf("malformed finding %v: a finding is", [f]))
	}
}

test_well_formed_findings_decide if {
	d := capkernel.decision with input as call("WRITE", []) with capkernel.findings as {{"mode": "escalated", "risk": 0.8, "basis": "x"}, {"mode": "autopilot", "risk": 0, "basis": "y"}}
	d.autonomy_mode == "escalated"
	d.risk_score == 0.8
	d.risk_basis == ["x", "y"]
}

# Settings of a type the rules cannot read would switch a rule off: each
# is named in config_errors, and the kernel refuses such a bundle at load.
config_error(cfg) := e if {
	e := capkernel.config_errors with data.capkernel.config as cfg
}

test_default_config_has_no_errors if count(capkernel.config_errors) == 0

test_config_errors_named if {
	every c in [
		[{"sensitive_paths": ".git/"}, `config.sensitive_paths is the string ".git/", not a list of strings`],
		[{"sensitive_paths": [".git/", 1]}, `config.sensitive_paths is an array, not a list of strings`],
		[{"allow_net_full": "true"}, `config.allow_net_full is the string "true", not a boolean`],
		[{"confirmation": []}, "config.confirmation is an array, not an object"],
		[{"confirmation": {"per-tool": {}}}, `config.confirmation has the member "per-tool", not one of ["default", "per_tool", "session", "trusted_workspace_overrides", "trusted_workspaces", "undeclared"]`],
		[{"confirmation": {"default": {"WRIET": "prompt"}}}, `config.confirmation.default names the class "WRIET", not one of ["EXECUTE", "NETWORK", "NONE", "READ", "WRITE"]`],
		[{"confirmation": {"default": {"WRITE": "deney"}}}, `config.confirmation.default["WRITE"] is the string "deney", not one of ["auto", "deny", "escalate", "prompt"]`],
		[{"confirmation": {"per_tool": {"net.post": "no_go"}}}, `config.confirmation.per_tool["net.post"] is the string "no_go", not one of ["auto", "deny", "escalate", "prompt"]`],
		[{"confirmation": {"per_tool": ["net.post"]}}, "config.confirmation.per_tool is an array, not an object (a setting for each tool id)"],
		[{"confirmation": {"session": {"EXECUTE": "yes"}}}, `config.confirmation.session["EXECUTE"] is the string "yes", not a boolean`],
		[{"confirmation": {"trusted_workspaces": "/srv/ws"}}, `config.confirmation.trusted_workspaces is the string "/srv/ws", not a list of strings`],
		[{"confirmation": {"undeclared": 1}}, `config.confirmation.undeclared is the number 1, not one of ["auto", "deny", "escalate", "prompt"]`],
		["none", `config is the string "none", not an object`],
	] {
		c[1] in config_error(c[0])
	}
}

test_config_absent_members_take_defaults if {
	count(config_error({})) == 0
	d := capkernel.decision with input as call("WRITE", [fs("write", ".git/config")]) with data.capkernel.config as {}
	d.autonomy_mode == "autopilot"
}

# Args over 16 KiB are left out of the input: a tool whose args a rule
# reads is escalated then, not decided as if the args said nothing.
omitted(tool) := object.union(call("NONE", []), {"tool_id": tool, "args_omitted": true, "args_size": 17000})

test_omitted_args_escalate_tools_whose_args_are_read if {
	cfg := object.union(data.capkernel.config, {"args_tools": ["echo"]})
	d := capkernel.decision with input as omitted("echo") with data.capkernel.config as cfg
	d.autonomy_mode == "escalated"
	"args of 17000 bytes left out of the policy input, and a rule reads the args of echo" in d.risk_basis
	o := capkernel.decision with input as omitted("fs.write") with data.capkernel.config as cfg
	o.autonomy_mode == "autopilot"
	all := capkernel.decision with input as omitted("fs.write") with data.capkernel.config as object.union(data.capkernel.config, {"args_tools": ["*"]})
	all.autonomy_mode == "escalated"
}

test_omitted_args_of_tools_no_rule_reads_are_decided_as_before if {
	decide(omitted("echo")).autonomy_mode == "autopilot"
	decide(object.union(omitted("echo"), {"args_omitted": false})).autonomy_mode == "autopilot"
}

test_args_tools_in_rules if {
	d := capkernel.decision with input as omitted("echo") with capkernel.args_tools as {"echo"}
	d.autonomy_mode == "escalated"
}

test_args_tools_shape if {
	`config.args_tools is the string "echo", not a list of strings` in config_error({"args_tools": "echo"})
}
