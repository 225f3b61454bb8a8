package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/mcpgateway"
)

// tsClient is the official MCP TypeScript SDK's client script
// (mcpgateway/testdata/tsclient, installed by make mcp-ts-deps).
const tsClient = "../../mcpgateway/testdata/tsclient"

// needTSClient skips a test without the TypeScript SDK installed, or
// fails it when CAPKERNEL_MCP_TS_TESTS=1 (as make test sets).
func needTSClient(t *testing.T) {
	t.Helper()
	_, err := os.Stat(filepath.Join(tsClient, "node_modules", "@modelcontextprotocol", "sdk", "package.json"))
	if _, nerr := exec.LookPath("node"); err == nil && nerr == nil {
		return
	}
	if os.Getenv("CAPKERNEL_MCP_TS_TESTS") == "1" {
		t.Fatal("the MCP TypeScript SDK is not installed: run make mcp-ts-deps")
	}
	t.Skip("the MCP TypeScript SDK is not installed (make mcp-ts-deps); CAPKERNEL_MCP_TS_TESTS=1 makes this fail")
}

// tsRun runs the TypeScript client and returns its steps by name.
func tsRun(t *testing.T, env []string, args ...string) map[string]map[string]any {
	t.Helper()
	cmd := exec.Command("node", append([]string{"client.mjs"}, args...)...)
	cmd.Dir = tsClient
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	steps := map[string]map[string]any{}
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			if s, ok := m["step"].(string); ok {
				steps[s] = m
			}
		}
	}
	if err != nil {
		t.Fatalf("TypeScript client %v: %v\nstdout:\n%s\nstderr:\n%.4000s", args, err, stdout.String(), stderr.String())
	}
	return steps
}

// tsFixture is a data dir whose token may call echo and fs.* on a
// workspace, whose reads may return 8 MiB, and an approver token.
func tsFixture(t *testing.T) (f runFixture, alice string) {
	t.Helper()
	f = newRunFixture(t)
	cfg := filepath.Join(f.data, "kernel.json")
	var m map[string]any
	b, _ := os.ReadFile(cfg)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["max_read_bytes"] = 8 << 20
	b, _ = json.Marshal(m)
	os.WriteFile(cfg, b, 0o600)
	os.WriteFile(f.token, []byte(mustRun(t, "token", "mint", "--data", f.data, "--agent", "agent-1", "--tools", "echo,fs.*", "--fs", f.ws+":rw")), 0o600)
	alice = filepath.Join(f.dir, "alice.token")
	os.WriteFile(alice, []byte(mustRun(t, "token", "mint", "--data", f.data, "--agent", "alice", "--approver")), 0o600)
	return f, alice
}

// startHTTPGateway starts kernelctl mcp --http and returns its URL.
func startHTTPGateway(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(kernelctl, append([]string{"mcp", "--http", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	url, ok := strings.CutPrefix(strings.TrimSpace(line), "mcp gateway on ")
	if err != nil || !ok {
		t.Fatalf("ready line %q: %v", line, err)
	}
	return url
}

// The official TypeScript SDK client, over stdio and streamable HTTP:
// lists and calls tools (the result once on the wire, with the receipt
// and replayed in _meta); a gated call outlives the client's request
// timeout because progress notifications reset it, until an approver
// decides through the control socket; a result of 6 MiB (12 MiB if it
// were sent twice, over the SDK's 10 MiB stdio buffer) arrives and the
// connection stays up; a foreign Origin is refused 403.
func TestMCPGatewayTypeScriptClient(t *testing.T) {
	needTSClient(t)
	for _, mode := range []string{"stdio", "http"} {
		t.Run(mode, func(t *testing.T) {
			f, alice := tsFixture(t)
			big := strings.Repeat("0123456789abcdef", 6<<20/16)
			os.WriteFile(filepath.Join(f.ws, "big.txt"), []byte(big), 0o644)
			gw := []string{"--data", f.data, "--token", f.token, "--progress-interval", "250ms"}
			// Over HTTP one gateway serves every scenario's client; over
			// stdio each client starts its own.
			var url string
			if mode == "http" {
				url = startHTTPGateway(t, gw...)
			}
			scenario := func(name string) []string {
				if mode == "stdio" {
					return append([]string{"stdio", name, kernelctl, "mcp"}, gw...)
				}
				return []string{"http", name, url}
			}

			steps := tsRun(t, nil, scenario("basic")...)
			names, _ := json.Marshal(steps["tools"]["names"])
			echo := steps["echo"]
			meta, _ := echo["meta"].(map[string]any)
			if !strings.Contains(string(names), `"echo"`) || echo["isError"] != false || echo["text"] != `{"text":"hi"}` ||
				echo["structured"] != nil || meta[mcpgateway.MetaReceiptID] == nil || meta[mcpgateway.MetaReplayed] != false {
				t.Fatalf("basic: %v", steps)
			}

			// The gated write: the client times a request out after 1.5 s
			// without progress; the approver decides after 4 s.
			approved := make(chan string, 1)
			go func() {
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					var pending []kernel.ApprovalRequest
					out, _, _ := run(t, "approvals", "list", "--data", f.data, "--json")
					if json.Unmarshal([]byte(out), &pending) == nil && len(pending) == 1 {
						time.Sleep(4 * time.Second)
						out, stderr, _ := run(t, "approvals", "approve", pending[0].ID, "--token", alice, "--data", f.data)
						approved <- out + stderr
						return
					}
				}
				approved <- "no pending approval"
			}()
			steps = tsRun(t, []string{"TIMEOUT_MS=1500"}, scenario("gated")...)
			if a := <-approved; !strings.Contains(a, "allowed by alice") {
				t.Fatalf("approve: %s", a)
			}
			g := steps["gated"]
			if g["isError"] != false || g["progress"].(float64) < 3 || g["elapsedMs"].(float64) < 2*g["timeoutMs"].(float64) {
				t.Fatalf("gated call: %v", g)
			}
			if b, _ := os.ReadFile(filepath.Join(f.ws, "Makefile")); string(b) != "approved\n" {
				t.Fatalf("Makefile after the approved write: %q", b)
			}

			steps = tsRun(t, []string{"BIG=big.txt"}, scenario("large")...)
			if l, a := steps["large"], steps["after"]; l["isError"] != false || l["bytes"].(float64) < float64(len(big)) || l["items"] != float64(1) ||
				l["structured"] != false || a["isError"] != false || a["closed"] != false {
				t.Fatalf("large result: %v", steps)
			}

			if mode == "http" {
				if s := tsRun(t, nil, "http", "origin", url); s["origin"]["status"] != float64(403) {
					t.Fatalf("foreign Origin: %v", s)
				}
			}
		})
	}
}

// sessionConfirmPolicy writes the default policy bundle with WRITE calls
// prompted and confirmable in the session into a dir, points the data
// dir's kernel.json at it and returns it. The data dir's kernel last ran
// under another policy, so the first verb to open it needs --policy DIR
// (docs/kernel.md, "The policy of a data dir").
func sessionConfirmPolicy(t *testing.T, data string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "policy")
	os.MkdirAll(dir, 0o755)
	b, err := os.ReadFile("../../policy/rego/capkernel.rego")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "capkernel.rego"), b, 0o644)
	var pd map[string]any
	b, _ = os.ReadFile("../../policy/rego/data.json")
	if err := json.Unmarshal(b, &pd); err != nil {
		t.Fatal(err)
	}
	conf := pd["capkernel"].(map[string]any)["config"].(map[string]any)["confirmation"].(map[string]any)
	conf["default"].(map[string]any)["WRITE"] = "prompt"
	conf["session"] = map[string]any{"WRITE": true}
	b, _ = json.Marshal(pd)
	os.WriteFile(filepath.Join(dir, "data.json"), b, 0o644)
	cfg := filepath.Join(data, "kernel.json")
	var m map[string]any
	b, _ = os.ReadFile(cfg)
	json.Unmarshal(b, &m)
	m["policy_dir"] = dir
	b, _ = json.Marshal(m)
	os.WriteFile(cfg, b, 0o600)
	return dir
}

// The TypeScript client, declaring elicitation, is asked to confirm a
// write the policy lets the session confirm (the tool, the arguments, the
// risk basis); its "allow" runs the call, recorded as the session user's
// decision in the receipt.
func TestMCPGatewayTypeScriptElicitation(t *testing.T) {
	needTSClient(t)
	f, _ := tsFixture(t)
	pol := sessionConfirmPolicy(t, f.data)
	steps := tsRun(t, nil, "stdio", "elicit", kernelctl, "mcp", "--data", f.data, "--token", f.token, "--policy", pol)
	e := steps["elicit"]
	asked, _ := json.Marshal(e["asked"])
	if e["isError"] != false || !strings.Contains(string(asked), "fs.write") || !strings.Contains(string(asked), "notes2.txt") || !strings.Contains(string(asked), "write in scope") {
		t.Fatalf("elicit: %v", steps)
	}
	if b, _ := os.ReadFile(filepath.Join(f.ws, "notes2.txt")); string(b) != "confirmed\n" {
		t.Fatalf("notes2.txt: %q", b)
	}
	rid, _ := e["meta"].(map[string]any)[mcpgateway.MetaReceiptID].(string)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out, _, code := run(t, "receipts", "show", rid, "--data", f.data)
		if code == 0 {
			if !strings.Contains(out, "session:") || !strings.Contains(out, "ok from the TypeScript client") {
				t.Fatalf("receipt lacks the session user's decision:\n%s", out)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("receipts show %s: %s", rid, out)
		}
	}
}
