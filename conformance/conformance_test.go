package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capkernel/capkernel/httpapi"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/receipts"
)

// The suite's own receipt verification against the receipts package's
// golden vector: the receipt proven by the log verifies with the JWKS
// alone, and not once altered.
func TestVerifyReceiptGolden(t *testing.T) {
	raw, err := os.ReadFile("../receipts/testdata/logged.json")
	if err != nil {
		t.Fatal(err)
	}
	jwks, err := os.ReadFile("../receipts/testdata/jwks.json")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := verifyLogged(raw, jwks); err != nil || e.Kind != "audit" {
		t.Fatalf("golden receipt: %v", err)
	}
	var l LoggedReceipt
	if err := json.Unmarshal(raw, &l); err != nil {
		t.Fatal(err)
	}
	for name, edit := range map[string]func(l *LoggedReceipt){
		"entry changed":      func(l *LoggedReceipt) { l.Entry = strings.Replace(l.Entry, `"echo"`, `"fs.read"`, 1) },
		"checkpoint changed": func(l *LoggedReceipt) { l.Checkpoint = strings.Replace(l.Checkpoint, "\n5\n", "\n4\n", 1) },
		"signature flipped": func(l *LoggedReceipt) {
			n := len(l.Checkpoint) - 30
			l.Checkpoint = l.Checkpoint[:n] + flip(l.Checkpoint[n:])
		},
		"proof hash changed": func(l *LoggedReceipt) { l.Inclusion.Proof[0] = l.Inclusion.LeafHash },
		"other leaf":         func(l *LoggedReceipt) { l.Inclusion.LeafIndex++ },
	} {
		m := l
		m.Inclusion.Proof = append([]string(nil), l.Inclusion.Proof...)
		edit(&m)
		b, _ := json.Marshal(m)
		if _, err := verifyLogged(b, jwks); err == nil {
			t.Errorf("%s: verified", name)
		}
	}
	if _, err := receipts.SignatureKeys(bytes.Replace(jwks, []byte(`"kid":"k`), []byte(`"kid":"X`), 1)); err == nil {
		t.Error("a JWKS whose kid is not the thumbprint was accepted")
	}
}

func flip(s string) string {
	b := []byte(s)
	if b[5] == 'A' {
		b[5] = 'B'
	} else {
		b[5] = 'A'
	}
	return string(b)
}

// Every case has a unique well-formed id, a group, a clause and a title.
func TestCaseTable(t *testing.T) {
	seen := map[string]bool{}
	idRE := regexp.MustCompile(`^(TOOL01|DESIGN|SEED000|SEED002)-[A-Z0-9-]+-[0-9]{3}$`)
	for _, c := range Cases() {
		if !idRE.MatchString(c.ID) || seen[c.ID] || c.Group == "" || c.Clause == "" || c.Title == "" || c.run == nil {
			t.Errorf("case %+v: bad or duplicate id, or missing group/clause/title", c.ID)
		}
		seen[c.ID] = true
	}
	// docs/conformance.md lists every case.
	doc, err := os.ReadFile("../docs/conformance.md")
	if err != nil {
		t.Fatal(err)
	}
	for id := range seen {
		if !bytes.Contains(doc, []byte("`"+id+"`")) {
			t.Errorf("docs/conformance.md does not list %s", id)
		}
	}
}

// inProcess serves a real kernel with the real HTTP API through handler
// wrap (nil: unchanged) and returns the URL and the admin credential.
func inProcess(t *testing.T, wrap func(http.Handler) http.Handler) (string, string) {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	ir, err := kernel.Init(data)
	if err != nil {
		t.Fatal(err)
	}
	k, err := kernel.Open(context.Background(), kernel.Config{DataDir: data, ApprovalTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = httpapi.New(k)
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { srv.Close(); k.Close() })
	return srv.URL, ir.AdminCredential
}

// A conforming endpoint passes; the suite fails endpoints that break the
// contract in the ways below (so its passes mean something).
func TestSuiteDetectsViolations(t *testing.T) {
	url, admin := inProcess(t, nil)
	rep := Run(context.Background(), Config{Server: url, AdminToken: admin, Workspace: t.TempDir()})
	if !rep.OK() || rep.Passed == 0 {
		for _, c := range rep.Cases {
			if c.Status == Fail {
				t.Errorf("%s: %s", c.ID, c.Message)
			}
		}
		t.Fatalf("in-process kernel: %s %s", rep.Summary(), rep.Error)
	}

	for _, tc := range []struct {
		name string
		// rewrite edits a POST /v1/syscalls answer (status, body).
		rewrite func(status int, body []byte) (int, []byte)
		// entries edits a GET /v1/ledger/entries answer.
		entries  func(body []byte) []byte
		run      string
		mustFail []string
	}{
		{
			name: "scope refusals reported as 200",
			rewrite: func(status int, body []byte) (int, []byte) {
				if bytes.Contains(body, []byte(`"class":"scope_denied"`)) {
					return 200, body
				}
				return status, body
			},
			run:      "ESCAPE|ERR-007",
			mustFail: []string{"SEED002-ESCAPE-001", "DESIGN-ERR-007"},
		},
		{
			name: "no receipts",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, regexp.MustCompile(`"receipt":\{"format":"[^"]*","entry":"(?:[^"\\]|\\.)*","inclusion":\{[^}]*\},"checkpoint":"(?:[^"\\]|\\.)*"\},`).ReplaceAll(body, nil)
			},
			run:      "AUDIT-001|RCPT-002|ENV-001",
			mustFail: []string{"TOOL01-INV-AUDIT-001", "DESIGN-RCPT-002", "TOOL01-ENV-001"},
		},
		{
			name: "a replay answered as a fresh call",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, bytes.Replace(body, []byte(`"replayed":true`), []byte(`"replayed":false`), 1)
			},
			run:      "REPLAY-00[23]",
			mustFail: []string{"TOOL01-INV-REPLAY-002", "TOOL01-INV-REPLAY-003"},
		},
		{
			name: "risk score reported other than recorded",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, regexp.MustCompile(`"risk_score":[0-9.]+`).ReplaceAll(body, []byte(`"risk_score":0`))
			},
			run:      "AUDIT-006|RCPT-002",
			mustFail: []string{"TOOL01-INV-AUDIT-006", "DESIGN-RCPT-002"},
		},
		// Each envelope field the receipt's record attests only through
		// its context commitment, or that the call never set, reported
		// otherwise: the receipt check opens the commitment.
		{
			name: "risk_basis reported other than recorded",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, regexp.MustCompile(`"risk_basis":\[[^\]]*\]`).ReplaceAll(body, []byte(`"risk_basis":["approved by the CISO"]`))
			},
			run:      "RCPT-002|REPLAY-010",
			mustFail: []string{"DESIGN-RCPT-002", "TOOL01-INV-REPLAY-010"},
		},
		{
			name: "a provenance reported that the call never had",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, bytes.Replace(body, []byte(`"risk_basis":`), []byte(`"provenance":{"approved_by":"CISO"},"risk_basis":`), 1)
			},
			run:      "RCPT-002",
			mustFail: []string{"DESIGN-RCPT-002"},
		},
		{
			name: "a task_class reported that the call never had",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, bytes.Replace(body, []byte(`"risk_basis":`), []byte(`"task_class":"admin","risk_basis":`), 1)
			},
			run:      "RCPT-002",
			mustFail: []string{"DESIGN-RCPT-002"},
		},
		{
			name: "notes reported that the call never had",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, bytes.Replace(body, []byte(`"risk_basis":`), []byte(`"notes":{"approved_by":"CISO"},"risk_basis":`), 1)
			},
			run:      "RCPT-002",
			mustFail: []string{"DESIGN-RCPT-002"},
		},
		{
			name: "notes dropped",
			rewrite: func(status int, body []byte) (int, []byte) {
				return status, regexp.MustCompile(`"notes":\{[^}]*\},`).ReplaceAll(body, nil)
			},
			run:      "REPLAY-010",
			mustFail: []string{"TOOL01-INV-REPLAY-010"},
		},
		{
			name: "ledger entries served with a rewritten body",
			entries: func(body []byte) []byte {
				return bytes.ReplaceAll(body, []byte(`"task_class":"`), []byte(`"task_class":"x`))
			},
			run:      "AUDIT-00[17]|AUDREC-001",
			mustFail: []string{"TOOL01-INV-AUDIT-001", "TOOL01-AUDREC-001"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, admin := inProcess(t, func(h http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, r)
					status, body := rec.Code, rec.Body.Bytes()
					switch {
					case tc.rewrite != nil && r.Method == "POST" && r.URL.Path == "/v1/syscalls":
						status, body = tc.rewrite(status, body)
					case tc.entries != nil && r.URL.Path == "/v1/ledger/entries":
						body = tc.entries(body)
					}
					for k, v := range rec.Header() {
						w.Header()[k] = v
					}
					w.Header().Del("Content-Length") // of the body before the rewrite
					w.WriteHeader(status)
					io.Copy(w, bytes.NewReader(body))
				})
			})
			rep := Run(context.Background(), Config{Server: url, AdminToken: admin, Workspace: t.TempDir(), Run: regexp.MustCompile(tc.run)})
			failed := map[string]string{}
			for _, c := range rep.Cases {
				if c.Status == Fail {
					failed[c.ID] = c.Message
				}
			}
			for _, id := range tc.mustFail {
				if _, ok := failed[id]; !ok {
					t.Errorf("%s did not fail (%s)", id, rep.Summary())
				}
			}
			b, _ := json.Marshal(failed)
			t.Logf("%s: %s", rep.Summary(), b)
		})
	}
}

// Run refuses to start without an endpoint, a working admin credential
// or a case to run.
func TestRunSetupErrors(t *testing.T) {
	url, admin := inProcess(t, nil)
	for _, cfg := range []Config{
		{AdminToken: "x"},
		{Server: url},
		{Server: url, AdminToken: "ckadmin_wrong", Workspace: t.TempDir()},
		{Server: "http://127.0.0.1:1", AdminToken: "x", Workspace: t.TempDir()},
		{Server: url, AdminToken: admin, Workspace: t.TempDir(), Run: regexp.MustCompile("NOSUCH")},
	} {
		rep := Run(context.Background(), cfg)
		if rep.Error == "" || rep.OK() || len(rep.Cases) != 0 {
			t.Errorf("%+v: ran (%s)", cfg, rep.Summary())
		}
	}
	if rep := Run(context.Background(), Config{Run: regexp.MustCompile("NOSUCH")}); rep.Error != `conformance: no case id matches "NOSUCH" (the ids are in docs/conformance.md)` {
		t.Errorf("a pattern matching no case: error %q", rep.Error)
	}
}
