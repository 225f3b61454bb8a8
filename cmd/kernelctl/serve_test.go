package main

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/captoken"
	"github.com/capkernel/capkernel/kernel"
)

// server is a `kernelctl serve` child process on a free loopback port.
type server struct {
	t    testing.TB
	cmd  *exec.Cmd
	url  string
	data string
	out  *bytes.Buffer // stderr after the ready line
	done chan error
}

// startServer runs serve on data and waits for its ready line.
func startServer(t testing.TB, data string) *server {
	t.Helper()
	return startServerArgs(t, data)
}

// served is a data dir made by kernelctl init in a temp dir, served by a
// kernelctl serve given the extra flags.
type served struct {
	*server
	dir       string // the temp dir holding data
	adminFile string
	admin     string
}

func initServed(t *testing.T, extra ...string) served {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	if _, stderr, code := run(t, "init", "--data", data); code != 0 {
		t.Fatal(stderr)
	}
	adminFile := filepath.Join(data, kernel.AdminFile)
	admin, err := readSecret(adminFile)
	if err != nil {
		t.Fatal(err)
	}
	return served{server: startServerArgs(t, data, extra...), dir: dir, adminFile: adminFile, admin: admin}
}

// startServerArgs is startServer with more serve flags.
func startServerArgs(t testing.TB, data string, extra ...string) *server {
	t.Helper()
	cmd := exec.Command(kernelctl, append([]string{"serve", "--data", data, "--listen", "127.0.0.1:0", "--drain", "20s"}, extra...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, cmd: cmd, data: data, out: &bytes.Buffer{}, done: make(chan error, 1)}
	cmd.Stderr = s.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("serve printed no ready line: %v (%s)", err, s.out)
	}
	// "serving <id> on http://127.0.0.1:PORT (policy …)"
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "serving" {
		t.Fatalf("ready line %q", line)
	}
	s.url = f[3]
	go func() { s.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-s.done
		s.done <- nil
	})
	return s
}

// stop sends SIGTERM and waits for a clean exit.
func (s *server) stop() {
	s.t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		if err != nil {
			s.t.Fatalf("serve exited with %v after SIGTERM: %s", err, s.out)
		}
		s.done <- nil
	case <-time.After(60 * time.Second):
		s.t.Fatalf("serve did not stop within 60s of SIGTERM: %s", s.out)
	}
}

// post sends a raw body to POST /v1/syscalls; every answer must be a
// result envelope.
func (s *server) post(body []byte, header ...string) (int, *kernel.Result) {
	s.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/syscalls", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var r kernel.Result
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		s.t.Fatalf("status %d without a result envelope: %v", resp.StatusCode, err)
	}
	if r.Receipt == nil || r.ResultHash == "" || r.OperationID == "" {
		s.t.Fatalf("result envelope without receipt, result_hash or operation_id: %+v", r)
	}
	return resp.StatusCode, &r
}

// get fetches path with an optional bearer credential.
func (s *server) get(path, cred string) (int, []byte) {
	s.t.Helper()
	return s.do(http.MethodGet, path, cred, nil)
}

func (s *server) do(method, path, cred string, body []byte) (int, []byte) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, bytes.NewReader(body))
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if cred != "" {
		req.Header.Set("Authorization", "Bearer "+cred)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// agentToken is a token minted with the CLI.
type agentToken struct {
	kernel.MintedToken
	file string
}

func mintCLI(t *testing.T, s *server, admin string, args ...string) agentToken {
	t.Helper()
	cmd := exec.Command(kernelctl, append([]string{"token", "mint", "--server", s.url, "--json"}, args...)...)
	cmd.Env = append(os.Environ(), "CAPKERNEL_ADMIN_TOKEN="+admin)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("token mint %v: %v", args, err)
	}
	var tok agentToken
	if err := json.Unmarshal(out, &tok.MintedToken); err != nil {
		t.Fatal(err)
	}
	tok.file = filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok.file, []byte(tok.Token+"\n"), 0o600)
	return tok
}

func envelope(tok agentToken, policyHash, tool string, args map[string]any, key string) []byte {
	a, _ := json.Marshal(args)
	env := map[string]any{"tool_id": tool, "args": json.RawMessage(a), "agent_id": tok.AgentID,
		"capability_token": tok.Token, "capability_token_id": tok.ID, "policy_hash": policyHash}
	if key != "" {
		env["idempotency_key"] = key
	}
	b, _ := json.Marshal(env)
	return b
}

func TestServeEndToEnd(t *testing.T) {
	dir := t.TempDir()
	data, ws := filepath.Join(dir, "data"), filepath.Join(dir, "ws")
	os.MkdirAll(ws, 0o755)
	os.WriteFile(filepath.Join(ws, "a.txt"), bytes.Repeat([]byte("a"), 1024), 0o644)
	if _, stderr, code := run(t, "init", "--data", data); code != 0 {
		t.Fatal(stderr)
	}
	adminBytes, _ := os.ReadFile(filepath.Join(data, kernel.AdminFile))
	admin := strings.TrimSpace(string(adminBytes))
	s := startServer(t, data)

	// One server per data dir: a second fails at once, saying why.
	start := time.Now()
	_, stderr, code := run(t, "serve", "--data", data, "--listen", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, "locked") || time.Since(start) > 10*time.Second {
		t.Fatalf("second serve: exit %d after %s: %s", code, time.Since(start), stderr)
	}
	// Reads of a served dir reach the server through its control socket.
	if out, stderr, code := run(t, "ledger", "verify", "--data", data); code != 0 || !strings.Contains(out, "intact") {
		t.Fatalf("ledger verify --data on a served dir: exit %d: %s%s", code, out, stderr)
	}

	// token mint prints the compact token alone.
	cmd := exec.Command(kernelctl, "token", "mint", "--server", s.url, "--agent", "a1", "--tools", "fs.*,echo", "--fs", ws+":rw", "--budget", "calls=1000,disk_write_bytes=1MiB", "--ttl", "1h")
	cmd.Env = append(os.Environ(), "CAPKERNEL_ADMIN_TOKEN="+admin)
	out, err := cmd.Output()
	if err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || strings.Count(string(out), ".") != 2 {
		t.Fatalf("token mint printed %q, %v", out, err)
	}
	tok := mintCLI(t, s, admin, "--agent", "a1", "--tools", "fs.*,echo", "--fs", ws+":rw", "--budget", "calls=1000,disk_write_bytes=1MiB")
	other := mintCLI(t, s, admin, "--agent", "a2", "--tools", "echo")
	tight := mintCLI(t, s, admin, "--agent", "a3", "--tools", "echo", "--budget", "calls=1")

	var pol struct {
		PolicyHash string `json:"policy_hash"`
	}
	_, b := s.get("/v1/policy", "")
	json.Unmarshal(b, &pol)

	// kernelctl call: ok exits 0, an error result exits 1.
	if stdout, stderr, code := run(t, "call", "fs.write", "--server", s.url, "--token", tok.file, "--arg", "path=b.txt", "--arg-str", "content=hello", "--idempotency-key", "cli-1"); code != 0 {
		t.Fatalf("call fs.write: exit %d: %s %s", code, stdout, stderr)
	}
	if got, _ := os.ReadFile(filepath.Join(ws, "b.txt")); string(got) != "hello" {
		t.Fatalf("b.txt = %q", got)
	}
	stdout, _, code := run(t, "call", "fs.read", "--server", s.url, "--token", tok.file, "--arg", "path=../etc/passwd", "--json")
	var denied kernel.Result
	json.Unmarshal([]byte(stdout), &denied)
	if code != 1 || denied.Error == nil || denied.Error.Class != kernel.ErrScopeDenied {
		t.Fatalf("call escaping the root: exit %d, %s", code, stdout)
	}

	// Raw HTTP: the status follows the error class; the body is always a
	// result envelope with a receipt.
	forgedKey := func() string {
		_, k, _ := ed25519.GenerateKey(rand.Reader)
		c := captoken.Claims{Subject: "a1", Audience: "x", ID: tok.ID, IssuedAt: time.Now(), NotBefore: time.Now(), Expiry: time.Now().Add(time.Hour), Cap: captoken.Capability{Tools: []string{"*"}}}
		f, _ := captoken.Mint(k, c)
		return f
	}()
	forged := tok
	forged.Token = forgedKey
	read := map[string]any{"path": "a.txt"}
	for _, tc := range []struct {
		name   string
		body   []byte
		header []string
		status int
		class  string
	}{
		{"ok read", envelope(tok, pol.PolicyHash, "fs.read", read, ""), nil, 200, ""},
		{"malformed JSON", []byte(`{"tool_id": "fs.read", "args": {`), nil, 400, kernel.ErrInvalidArgs},
		{"not JSON at all", []byte("\x00\xff garbage"), nil, 400, kernel.ErrInvalidArgs},
		{"unknown field", []byte(`{"tool_id":"echo","args":{},"bogus":1}`), nil, 400, kernel.ErrInvalidArgs},
		{"oversize body", append([]byte(`{"tool_id":"echo","args":{"text":"`), bytes.Repeat([]byte("x"), 2<<20)...), nil, 413, kernel.ErrInvalidArgs},
		{"forged token", envelope(forged, pol.PolicyHash, "fs.read", read, ""), nil, 401, kernel.ErrTokenInvalid},
		{"admin credential as token", bytes.Replace(envelope(tok, pol.PolicyHash, "echo", map[string]any{"text": "x"}, ""), []byte(tok.Token), []byte(admin), 1), nil, 401, kernel.ErrTokenInvalid},
		{"admin credential as bearer", envelope(tok, pol.PolicyHash, "echo", map[string]any{"text": "x"}, ""), []string{"Authorization", "Bearer " + admin}, 401, kernel.ErrTokenInvalid},
		{"tool not granted", envelope(other, pol.PolicyHash, "fs.read", read, ""), nil, 403, kernel.ErrPermissionDenied},
		{"no such tool", envelope(tok, pol.PolicyHash, "fs.nope", read, ""), nil, 404, kernel.ErrToolNotFound},
		{"write without key", envelope(tok, pol.PolicyHash, "fs.write", map[string]any{"path": "c.txt", "content": "c"}, ""), nil, 400, kernel.ErrIdempotencyKeyRequired},
		{"same key, other args", envelope(tok, pol.PolicyHash, "fs.write", map[string]any{"path": "b.txt", "content": "other"}, "cli-1"), nil, 422, kernel.ErrIdempotencyConflict},
		{"stale policy hash", envelope(tok, "blake3:"+strings.Repeat("0", 64), "fs.read", read, ""), nil, 409, kernel.ErrPolicyMismatch},
		{"bad args", envelope(tok, pol.PolicyHash, "fs.read", map[string]any{"path": 7}, ""), nil, 400, kernel.ErrInvalidArgs},
		{"budget: first call", envelope(tight, pol.PolicyHash, "echo", map[string]any{"text": "x"}, ""), nil, 200, ""},
		{"budget: second call", envelope(tight, pol.PolicyHash, "echo", map[string]any{"text": "x"}, ""), nil, 429, kernel.ErrBudgetExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, r := s.post(tc.body, tc.header...)
			class := ""
			if r.Error != nil {
				class = r.Error.Class
			}
			if status != tc.status || class != tc.class {
				t.Fatalf("status %d class %q, want %d %q (%+v)", status, class, tc.status, tc.class, r.Error)
			}
		})
	}

	// Tool listing: the token's tools only; the admin credential is refused.
	status, b := s.get("/v1/syscalls?format=mcp", other.Token)
	if status != 200 || !strings.Contains(string(b), `"echo"`) || strings.Contains(string(b), "fs.read") {
		t.Fatalf("GET /v1/syscalls for an echo-only token: %d %s", status, b)
	}
	if status, _ := s.get("/v1/syscalls", admin); status != 401 {
		t.Fatalf("GET /v1/syscalls with the admin credential: %d, want 401", status)
	}
	// Admin endpoints refuse capability tokens.
	if status, _ := s.do(http.MethodPost, "/v1/tokens", tok.Token, []byte(`{"agent_id":"x","tools":["*"]}`)); status != 403 {
		t.Fatalf("POST /v1/tokens with a capability token: %d, want 403", status)
	}
	if status, _ := s.do(http.MethodPost, "/v1/tokens", "", []byte(`{"agent_id":"x","tools":["*"]}`)); status != 401 {
		t.Fatalf("POST /v1/tokens without credential: %d, want 401", status)
	}
	// Stored operations: the agent's own, not another's.
	_, mine := s.post(envelope(tok, pol.PolicyHash, "fs.write", map[string]any{"path": "d.txt", "content": "d"}, "op-1"))
	if status, _ := s.get("/v1/operations/"+mine.OperationID, tok.Token); status != 200 {
		t.Fatalf("own operation: %d", status)
	}
	if status, _ := s.get("/v1/operations/"+mine.OperationID, other.Token); status != 404 {
		t.Fatalf("another agent's operation: %d, want 404", status)
	}

	// Receipts verify against the JWKS endpoint's key and the ledger.
	_, jwks := s.get("/.well-known/jwks.json", "")
	jwksFile := filepath.Join(dir, "jwks.json")
	os.WriteFile(jwksFile, jwks, 0o644)
	withAdmin := func(args ...string) (string, string, int) {
		c := exec.Command(kernelctl, args...)
		c.Env = append(os.Environ(), "CAPKERNEL_ADMIN_TOKEN="+admin)
		var o, e bytes.Buffer
		c.Stdout, c.Stderr = &o, &e
		err := c.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		return o.String(), e.String(), code
	}
	if out, errOut, code := withAdmin("receipts", "verify", mine.ReceiptID, "--server", s.url, "--jwks", jwksFile); code != 0 || !strings.Contains(out, "ledger match: ok") {
		t.Fatalf("receipts verify: exit %d: %s %s", code, out, errOut)
	}
	// As README has it: the server from the environment, no flag.
	c := exec.Command(kernelctl, "receipts", "verify", mine.ReceiptID)
	c.Env = append(os.Environ(), "CAPKERNEL_ADMIN_TOKEN="+admin, "CAPKERNEL_SERVER="+s.url)
	if out, err := c.CombinedOutput(); err != nil || !strings.Contains(string(out), "ledger match: ok") {
		t.Fatalf("receipts verify with CAPKERNEL_SERVER: %v: %s", err, out)
	}
	resultFile := filepath.Join(dir, "result.json")
	rb, _ := json.Marshal(mine)
	os.WriteFile(resultFile, rb, 0o644)
	if out, _, code := withAdmin("receipts", "verify", resultFile, "--jwks", jwksFile); code != 0 || !strings.Contains(out, "signature:    ok") {
		t.Fatalf("offline receipts verify: exit %d: %s", code, out)
	}
	wrongJWKS := filepath.Join(dir, "wrong.json")
	os.WriteFile(wrongJWKS, bytes.Replace(jwks, []byte(`"x":"`), []byte(`"x":"A`), 1), 0o644)
	if _, _, code := withAdmin("receipts", "verify", resultFile, "--jwks", wrongJWKS); code != 1 {
		t.Fatalf("receipts verify with a wrong key: exit %d, want 1", code)
	}

	// SIGTERM during a burst of writes: calls in flight finish, the
	// server exits cleanly, and no write is half-applied.
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[string]string{} // file -> content the server confirmed committed
	stopBurst := make(chan struct{})
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stopBurst:
					return
				default:
				}
				name := fmt.Sprintf("burst-%d-%d.txt", w, i)
				content := strings.Repeat(name, 50)
				req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/syscalls", bytes.NewReader(envelope(tok, pol.PolicyHash, "fs.write", map[string]any{"path": name, "content": content}, name)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return // the server stopped accepting
				}
				var r kernel.Result
				json.NewDecoder(resp.Body).Decode(&r)
				resp.Body.Close()
				if resp.StatusCode == 200 && r.TxOutcome == kernel.Committed {
					mu.Lock()
					acked[name] = content
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	s.stop()
	close(stopBurst)
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("no write committed before SIGTERM")
	}
	for name, content := range acked {
		if got, err := os.ReadFile(filepath.Join(ws, name)); err != nil || string(got) != content {
			t.Fatalf("%s was acknowledged as committed but holds %q (%v)", name, clip(string(got), 40), err)
		}
	}
	entries, _ := os.ReadDir(ws)
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, "burst-") {
			if got, _ := os.ReadFile(filepath.Join(ws, name)); string(got) != strings.Repeat(name, 50) {
				t.Fatalf("%s is half-written: %q", name, clip(string(got), 40))
			}
		} else if name != "a.txt" && name != "b.txt" && name != "d.txt" {
			t.Fatalf("unexpected file %s left in the workspace (staging?)", name)
		}
	}
	// Stopped: the data dir verifies read-only.
	for _, args := range [][]string{{"ledger", "verify", "--data", data}, {"replay", "verify", "--data", data}} {
		if out, errOut, code := withAdmin(args...); code != 0 {
			t.Fatalf("%v on the stopped kernel: exit %d: %s %s", args, code, out, errOut)
		}
	}
	// Restarted, it verifies through the API too, and replays what was
	// acknowledged instead of writing again.
	s = startServer(t, data)
	for _, args := range [][]string{{"ledger", "verify", "--server", s.url}, {"replay", "verify", "--server", s.url}} {
		if out, errOut, code := withAdmin(args...); code != 0 {
			t.Fatalf("%v after restart: exit %d: %s %s", args, code, out, errOut)
		}
	}
	for name, content := range acked {
		_, r := s.post(envelope(tok, pol.PolicyHash, "fs.write", map[string]any{"path": name, "content": content}, name))
		if !r.Replayed {
			t.Fatalf("%s: a repeat after restart was not replayed: %+v", name, r)
		}
		break
	}
	s.stop()
}

func TestServeRefusesNonLoopbackWithoutTLS(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	run(t, "init", "--data", data)
	for _, addr := range []string{"0.0.0.0:0", ":0", "192.0.2.1:7070"} {
		if _, stderr, code := run(t, "serve", "--data", data, "--listen", addr); code != 2 || !strings.Contains(stderr, "tls") {
			t.Errorf("serve --listen %s: exit %d: %s", addr, code, stderr)
		}
	}
}

func TestDemoAgainstServer(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	run(t, "init", "--data", data)
	s := startServer(t, data)
	cmd := exec.Command(kernelctl, "demo", "--server", s.url, "--admin-token", filepath.Join(data, kernel.AdminFile))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ledger intact") || !strings.Contains(string(out), "replays proven") || demoFailed.Match(out) {
		t.Fatalf("demo --server: %v\n%s", err, out)
	}
	s.stop()
}

// writeKeyPair writes a self-signed certificate for 127.0.0.1 and its key
// as PEM files in dir and returns their paths and the certificate.
func writeKeyPair(t *testing.T, dir string) (certFile, keyFile string, cert *x509.Certificate) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kernelctl test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	if cert, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}), 0o600)
	return certFile, keyFile, cert
}

// TestServeTLS: serve loads --tls-cert and --tls-key before it listens, so
// a wrong file fails it (exit 2, naming the flag) before its ready line,
// which a supervisor takes as success; a good pair serves https.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	mustRun(t, "init", "--data", data)
	certFile, keyFile, cert := writeKeyPair(t, dir)
	notPEM := filepath.Join(dir, "not.pem")
	os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600)
	missing := filepath.Join(dir, "missing.pem")
	for _, c := range []struct {
		name, cert, key, stderr string
	}{
		{"missing cert", missing, keyFile, "--tls-cert " + missing + ": no such file or directory"},
		{"missing key", certFile, missing, "--tls-key " + missing + ": no such file or directory"},
		{"cert not PEM", notPEM, keyFile, "--tls-cert " + notPEM + " with --tls-key " + keyFile + ": tls: failed to find any PEM data in certificate input"},
		{"key not PEM", certFile, notPEM, "--tls-key " + notPEM + ": tls: failed to find any PEM data in key input"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, stderr, code := run(t, "serve", "--data", data, "--listen", "127.0.0.1:0", "--tls-cert", c.cert, "--tls-key", c.key)
			if code != 2 || out != "" || !strings.Contains(stderr, c.stderr) {
				t.Fatalf("serve: exit %d (want 2), stdout %q (want none), stderr %q (want %q)", code, out, stderr, c.stderr)
			}
		})
	}

	s := startServerArgs(t, data, "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(s.url, "https://127.0.0.1:") {
		t.Fatalf("serve with TLS is ready on %s", s.url)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	resp, err := c.Get(s.url + "/v1/ledger/head")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("GET /v1/ledger/head over TLS: %s, %s (want 200 over HTTP/2, as ServeTLS offers it)", resp.Status, resp.Proto)
	}
	s.stop()
}
