package upstream

import (
	"bufio"
	"io"
	"log/slog"
	"strings"
	"testing"
)

// TestFramer: frames up to the limit pass unchanged (sizes count the
// newline); a longer response is
// replaced by an error response to its request, found by the top-level id
// wherever it stands; a longer frame that is no response is dropped; the
// frames after it come through.
func TestFramer(t *testing.T) {
	big := strings.Repeat("x", 100)
	tests := []struct {
		name, in, want string
	}{
		{"small frames pass", `{"id":1,"result":{}}` + "\n" + `{"id":2}` + "\n", `{"id":1,"result":{}}` + "\n" + `{"id":2}` + "\n"},
		{"id first", `{"jsonrpc":"2.0","id":7,"result":{"t":"` + big + `"}}` + "\n", `{"jsonrpc":"2.0","id":7,"error":{"code":-32099,"message":"the upstream's answer is 143 bytes; the frame limit is 64 bytes","data":{"bytes":143}}}` + "\n"},
		{"id last, string, nested ids skipped", `{"result":{"id":99,"t":"` + big + `","a":[{"id":5}]},"jsonrpc":"2.0","id":"k\"1"}` + "\n",
			`{"jsonrpc":"2.0","id":"k\"1","error":{"code":-32099,"message":"the upstream's answer is 171 bytes; the frame limit is 64 bytes","data":{"bytes":171}}}` + "\n"},
		{"escaped quotes and braces in strings", `{"result":{"t":"\"}{,:id` + big + `"},"id":3}` + "\n" + `{"id":4}` + "\n",
			`{"jsonrpc":"2.0","id":3,"error":{"code":-32099,"message":"the upstream's answer is 135 bytes; the frame limit is 64 bytes","data":{"bytes":135}}}` + "\n" + `{"id":4}` + "\n"},
		{"a request over the limit is dropped", `{"method":"notifications/message","params":{"t":"` + big + `"}}` + "\n" + `{"id":4}` + "\n", `{"id":4}` + "\n"},
		{"no id: dropped", `{"result":"` + big + `"}` + "\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A 16-byte reader buffer makes every long frame span many reads.
			f := &framer{r: bufio.NewReaderSize(strings.NewReader(tc.in), 16), limit: 64, log: slog.New(slog.DiscardHandler)}
			got, err := io.ReadAll(f)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}
