package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/receipts"
)

// checkAppendResult fails t unless appendResult encodes r to exactly
// json.Marshal's bytes, or reports false exactly when json.Marshal fails.
func checkAppendResult(t *testing.T, r *kernel.Result) {
	t.Helper()
	want, werr := json.Marshal(r)
	got, ok := appendResult([]byte("prefix"), r)
	switch {
	case werr != nil && ok:
		t.Fatalf("json.Marshal fails (%v), appendResult made %s", werr, got)
	case werr == nil && !ok:
		t.Fatalf("appendResult failed where json.Marshal made %s", want)
	case werr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)):
		t.Fatalf("appendResult:\n%s\njson.Marshal:\nprefix%s", got, want)
	}
}

// fill sets every field of the value v points to, at every depth, to a
// value that is not its zero value, so a field appendResult leaves out
// shows. A field of a kind it does not know fails the test: teach fill
// (and appendResult) the new field.
func fill(t *testing.T, v reflect.Value, name string) {
	t.Helper()
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), name)
	case reflect.Struct:
		for i := range v.NumField() {
			if f := v.Type().Field(i); f.IsExported() { // the others are not encoded
				fill(t, v.Field(i), f.Name)
			}
		}
	case reflect.String:
		v.SetString("value of " + name)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Uint64:
		v.SetUint(math.MaxUint64 - 7)
	case reflect.Float64:
		v.SetFloat(0.25)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for _, k := range []string{"b_" + name, "a_" + name} {
			e := reflect.New(v.Type().Elem()).Elem()
			fill(t, e, k)
			v.SetMapIndex(reflect.ValueOf(k), e)
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			v.SetBytes([]byte(`{"` + name + `":[1,2.5,"x",{"y":null},true]}`))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(t, v.Index(0), name+"[0]")
		fill(t, v.Index(1), name+"[1]")
	default:
		t.Fatalf("fill: field %s is a %s; appendResult and fill know no such field", name, v.Type())
	}
}

// realistic is an fs.read answer as the kernel makes it.
func realistic() *kernel.Result {
	return &kernel.Result{
		ToolID: "fs.read", AgentID: "bench", OperationID: "01a218b6-c2b7-729f-9d79-beaf582858a3",
		StateSnapshotID: "2:blake3:dc2c7c1dc23bec9b3671c7a08b2aac9dd864391debffa395b7b3ee4c329fc435", Status: kernel.StatusOK,
		Result:     json.RawMessage(`{"content":"` + strings.Repeat("x", 1024) + `","hash":"blake3:77","size":1024}`),
		ResultHash: "blake3:7706fe956d6e1825311bdb51dac90f1024ce9ef36cdc45c48644ae69d6c1b841",
		Provenance: json.RawMessage(`{"session_id":"bench-3"}`), AutonomyMode: "autopilot", RiskScore: 0.05,
		RiskBasis: []string{"no side effects"}, TxOutcome: kernel.NoOp, ReceiptID: "r2-dc2c7c1dc23bec9b",
		Receipt: &receipts.Logged{
			Format:     receipts.Format,
			Entry:      `{"body":{"agent_id":"agent-1","args_commitment":"blake3:ad4dc4a4c991e48f1ab7e323a35b64fe7b5f012c9c8ea0e1f19b037cdb1a75b8","autonomy_mode":"autopilot","capability_token_id":"01a218b6-c2b6-7134-a6b0-4813f4b59c88","context_commitment":"blake3:5867de74cdce45e80efbb58ca165feb49b9235c598b16a5ce2373caf8a10859d","decided_mode":"autopilot","operation_id":"01a218b6-c2b7-729f-9d79-beaf582858a3","payload_depth":"full","policy_hash":"blake3:5f27aa54210dcb525fb761733704311d3614f75e8b1af4bf6683ddfcd0ceee56","policy_input_commitment":"blake3:3eccf8826885318069370dd091e2055a2e23e05f1dcec8ad55485731a7e91cbb","result_commitment":"blake3:f76e0b0a0772af4b625a405f06916d51f26faf5dfc5eebf973c4d54a0fa01c68","risk_score":0.05,"started_at":"2026-11-26T16:36:00.311154889Z","state_snapshot_id":"","status":"ok","task_class":"","token_hash":"blake3:3e6cc67c3f918dd47965f1dd2b1f2543a161564c06d642834531261a1be74c5e","tool_id":"echo","tx_outcome":"no_op"},"entry_hash":"blake3:dc2c7c1dc23bec9b3671c7a08b2aac9dd864391debffa395b7b3ee4c329fc435","kind":"audit","prev_hash":"blake3:b63255e932101d3476508b901031c5496bee89e1be2bf9d1d069a6db073bb83a","seq":2,"time":"2026-11-26T16:36:00.312122358Z"}`,
			Inclusion:  ledger.Inclusion{LeafIndex: 2, TreeSize: 3, LeafHash: "blake3:dc2c", Proof: []string{"blake3:93ac", "blake3:0011"}},
			Checkpoint: "ck-5005d3d9\n3\nLOs1qpC3e7IJdm4X5QXUDQh5Bt71kGXIx3BqjArZfZ0=\n\n— ck-5005d3d9 yfNiZANmfMEEW7Vp+/B04L2uo3GcUGRUjSuNIIz/ftTJlATD+Jx==\n",
		},
		LedgerSeq: 2, AuditSalt: "e3d3a4d5e1b230e094e76cd1d663bcbb598b956a7691c1bd6b0722c493e3352c",
	}
}

// appendResult makes json.Marshal's bytes of every field, and of the
// values its plain paths leave to encoding/json.
func TestAppendResult(t *testing.T) {
	var filled kernel.Result
	fill(t, reflect.ValueOf(&filled).Elem(), "Result")
	tests := []struct {
		name string
		mod  func(r *kernel.Result)
	}{
		{"realistic", func(*kernel.Result) {}},
		{"every field set", func(r *kernel.Result) { *r = filled }},
		{"zero", func(r *kernel.Result) { *r = kernel.Result{} }},
		{"error, nothing optional", func(r *kernel.Result) {
			*r = kernel.Result{Status: kernel.StatusError, Error: &kernel.Error{Class: kernel.ErrInvalidArgs, Message: `envelope: duplicate member name "a" in /args`}, RiskBasis: []string{}}
		}},
		{"empty risk basis and proof", func(r *kernel.Result) { r.RiskBasis, r.Receipt.Inclusion.Proof = []string{}, []string{} }},
		{"nil proof", func(r *kernel.Result) { r.Receipt.Inclusion.Proof = nil }},
		{"empty raw", func(r *kernel.Result) { r.Result, r.Provenance = json.RawMessage{}, json.RawMessage{} }},
		{"raw null", func(r *kernel.Result) { r.Result = json.RawMessage(`null`) }},
		{"raw with white space", func(r *kernel.Result) { r.Result = json.RawMessage(" {\"a\" : [1, 2],\n\t\"b\":\"x y\"} ") }},
		{"raw with html", func(r *kernel.Result) { r.Result = json.RawMessage(`{"a":"<b>&amp;</b>"}`) }},
		{"raw with escapes", func(r *kernel.Result) { r.Result = json.RawMessage(`{"a":"\u0041\n\"\\\/\t\u00e9\ud83d\ude00"}`) }},
		{"raw text file", func(r *kernel.Result) {
			r.Result = json.RawMessage(`{"content":"line one\nline two\ttab \"q\" \u00e9 \\ end","size":40}`)
		}},
		{"raw with quote and backslash", func(r *kernel.Result) { r.Result = json.RawMessage(`{"a\"":"\\\"\\"}`) }},
		{"raw with unicode", func(r *kernel.Result) { r.Result = json.RawMessage(`{"é":"—✓😀"}`) }},
		{"raw with line separators", func(r *kernel.Result) { r.Result = json.RawMessage("{\"a\":\"\u2028\u2029\"}") }},
		{"raw with invalid UTF-8", func(r *kernel.Result) { r.Result = json.RawMessage("{\"a\":\"\xff\"}") }},
		{"raw with duplicate names", func(r *kernel.Result) { r.Result = json.RawMessage(`{"a":1,"a":2}`) }},
		{"raw numbers", func(r *kernel.Result) {
			r.Result = json.RawMessage(`[1.0,1e3,-0,1E+2,0.000001,12345678901234567890123]`)
		}},
		{"raw scalar", func(r *kernel.Result) { r.Result = json.RawMessage(`"a"`) }},
		{"raw invalid", func(r *kernel.Result) { r.Result = json.RawMessage(`{"a":}`) }},
		{"raw truncated", func(r *kernel.Result) { r.Provenance = json.RawMessage(`{"a":"b`) }},
		{"raw trailing data", func(r *kernel.Result) { r.Result = json.RawMessage(`{} {}`) }},
		{"raw dangling backslash", func(r *kernel.Result) { r.Result = json.RawMessage(`"\`) }},
		{"strings with html", func(r *kernel.Result) { r.Error = &kernel.Error{Class: "x", Message: "<script>&</script>"} }},
		{"strings with controls", func(r *kernel.Result) { r.AgentID = "a\x00b\x01\x08\x0c\x1f\x7f\n\r\t" }},
		{"strings with short escapes", func(r *kernel.Result) { r.AgentID = "\b\f\n\r\t\"\\\x7f" }},
		{"strings with invalid UTF-8", func(r *kernel.Result) { r.ToolID, r.AgentID = "a\xffb", "\xe2\x80" }},
		{"strings with line separators", func(r *kernel.Result) { r.TaskClass = "a\u2028b\u2029c" }},
		{"strings with unicode", func(r *kernel.Result) { r.TaskClass = "é—✓😀\ufffd\U0010ffff" }},
		{"float 0", func(r *kernel.Result) { r.RiskScore = 0 }},
		{"float -0", func(r *kernel.Result) { r.RiskScore = math.Copysign(0, -1) }},
		{"float 1", func(r *kernel.Result) { r.RiskScore = 1 }},
		{"float tiny", func(r *kernel.Result) { r.RiskScore = 1e-7 }},
		{"float small", func(r *kernel.Result) { r.RiskScore = 1e-6 }},
		{"float huge", func(r *kernel.Result) { r.RiskScore = 1e21 }},
		{"float below huge", func(r *kernel.Result) { r.RiskScore = 999999999999999999999 }},
		{"float negative", func(r *kernel.Result) { r.RiskScore = -0.123456789 }},
		{"float third", func(r *kernel.Result) { r.RiskScore = 1.0 / 3 }},
		{"float NaN", func(r *kernel.Result) { r.RiskScore = math.NaN() }},
		{"float Inf", func(r *kernel.Result) { r.RiskScore = math.Inf(1) }},
		{"notes", func(r *kernel.Result) {
			r.Notes = map[string]json.RawMessage{"net_connections": json.RawMessage(`[{"host":"a.test","allowed":true}]`), "handle": json.RawMessage(`"/object/x"`)}
		}},
		{"notes with odd names", func(r *kernel.Result) {
			r.Notes = map[string]json.RawMessage{"é": json.RawMessage(`1`), "a<b": json.RawMessage(`2`), "Z": json.RawMessage(` [ 3 ] `), "": json.RawMessage(`4`)}
		}},
		{"notes with invalid raw", func(r *kernel.Result) { r.Notes = map[string]json.RawMessage{"a": json.RawMessage(`{`)} }},
		{"empty notes", func(r *kernel.Result) { r.Notes = map[string]json.RawMessage{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := realistic()
			tt.mod(r)
			checkAppendResult(t, r)
		})
	}
}

// The plain paths agree with encoding/json on any string, raw value and
// float.
func FuzzAppendResult(f *testing.F) {
	f.Add("a\"b\\c", []byte(`{"a":"b"}`), 0.05)
	f.Add("<&>\u2028\xff", []byte(` [1, "\u0041"] `), 1e-7)
	f.Add("é\n\r\t\x00\x7f", []byte(`{"a":"\"\\"}`), -0.0)
	f.Fuzz(func(t *testing.T, s string, raw []byte, x float64) {
		r := realistic()
		r.AgentID, r.Receipt.Entry, r.Result, r.RiskScore = s, s, raw, x
		r.Notes = map[string]json.RawMessage{s: raw, "handle": json.RawMessage(`"h"`)}
		checkAppendResult(t, r)
	})
}

// BenchmarkAppendResult: the encoding of an fs.read answer, by
// appendResult and by encoding/json, with the process's CPU time per
// encoding (cpu-ns/op: on a busy machine ns/op counts time waiting for a
// core as well).
//
//	go test -run '^$' -bench AppendResult ./httpapi/
func BenchmarkAppendResult(b *testing.B) {
	r := realistic()
	for range 13 {
		r.Receipt.Inclusion.Proof = append(r.Receipt.Inclusion.Proof, "blake3:93ac8e73ca0b37eac622f8e37da42c476d1e1eadcaa241378573c3bb93f06e3c")
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, enc := range []struct {
		name string
		f    func(buf []byte) []byte
	}{
		{"appendResult", func(buf []byte) []byte { buf, _ = appendResult(buf[:0], r); return buf }},
		{"json.Marshal", func([]byte) []byte { b, _ := json.Marshal(r); return b }},
	} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			start := cpu()
			for b.Loop() {
				buf = enc.f(buf)
			}
			b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// failingWriter is a ResponseWriter whose body writes fail, keeping what
// they were given, as an HTTP/2 stream reset mid-copy leaves a body.
type failingWriter struct {
	h    http.Header
	kept [][]byte
}

func (w *failingWriter) Header() http.Header { return w.h }
func (w *failingWriter) WriteHeader(int)     {}
func (w *failingWriter) Write(p []byte) (int, error) {
	w.kept = append(w.kept, p)
	return 0, errors.New("stream reset")
}

// TestFailedAnswerKeepsItsBuffer: an answer whose write failed does not
// give its buffer back to the pool, where the next answer would write
// into bytes the failed write may still be reading.
func TestFailedAnswerKeepsItsBuffer(t *testing.T) {
	w := &failingWriter{h: http.Header{}}
	writeResult(w, http.StatusOK, &kernel.Result{ToolID: "echo", Status: kernel.StatusOK, Result: json.RawMessage(`{"text":"hi"}`)})
	if len(w.kept) != 1 {
		t.Fatalf("%d writes", len(w.kept))
	}
	for range 4 {
		bp := bodyBuffers.Get().(*[]byte)
		if b := (*bp)[:1]; &b[0] == &w.kept[0][0] {
			t.Fatal("the failed answer's buffer is back in the pool")
		}
	}
}
