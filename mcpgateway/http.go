package mcpgateway

import (
	"bytes"
	"io"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// MaxHTTPBody bounds the body of a request to the HTTP server.
const MaxHTTPBody = 8 << 20

// tagHTTP copies the JSON-RPC id of each tools/call POSTed to h into its
// _meta, as idTransport does for stdio: the SDK's HTTP handler makes its
// own transports. A body it cannot decode goes on as it came, for the SDK
// to answer.
func tagHTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, MaxHTTPBody+1))
		r.Body.Close()
		if err != nil {
			http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		if len(body) > MaxHTTPBody {
			http.Error(w, "request body over "+strconv.Itoa(MaxHTTPBody)+" bytes", http.StatusRequestEntityTooLarge)
			return
		}
		if m, err := jsonrpc.DecodeMessage(body); err == nil {
			if req, ok := m.(*jsonrpc.Request); ok && req.Method == "tools/call" && req.ID.IsValid() {
				req.Params = tagParams(req.Params, req.ID.Raw())
				if b, err := jsonrpc.EncodeMessage(req); err == nil {
					body = b
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	})
}
