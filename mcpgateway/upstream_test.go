package mcpgateway

import (
	"encoding/json"
	"testing"

	"github.com/capkernel/capkernel/kernel"
)

// TestUpstreamResult: an upstream tool's result reaches the client as the
// upstream sent it (content items, structuredContent, _meta), not wrapped
// in a text item; a built-in's is not touched here.
func TestUpstreamResult(t *testing.T) {
	up := `{"_meta":{"x":1},"content":[{"type":"image","data":"iVBORw==","mimeType":"image/png"},{"type":"resource_link","uri":"demo://r/1","name":"r1"}],"structuredContent":{"t":22}}`
	res := &kernel.Result{ToolID: "mcp.ev.get_tiny_image", Status: kernel.StatusOK, Result: json.RawMessage(up), ReceiptID: "rc", OperationID: "op", LedgerSeq: 9}
	r, ok := upstreamResult(res)
	if !ok {
		t.Fatal("not taken as an upstream result")
	}
	b, _ := json.Marshal(r)
	want := `{"_meta":{"capkernel/ledger_seq":9,"capkernel/operation_id":"op","capkernel/receipt_id":"rc","capkernel/replayed":false,"x":1},"content":[{"type":"image","mimeType":"image/png","data":"iVBORw=="},{"type":"resource_link","uri":"demo://r/1","name":"r1"}],"structuredContent":{"t":22}}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	if _, ok := upstreamResult(&kernel.Result{ToolID: "fs.read", Result: json.RawMessage(`{"content":[]}`)}); ok {
		t.Fatal("a built-in's result taken as an upstream result")
	}
}
