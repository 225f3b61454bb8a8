// Command agent is the smallest agent that works through capkernel's
// runner channel: started by `kernelctl run`, it finds the channel on the
// file descriptor CAPKERNEL_IPC_FD names, sends a few tool calls at once,
// matches the answers by tool_call_id and prints them.
//
//	kernelctl run --data DIR --token agent.token -- ./agent [PATH]
//
// It reads PATH (default notes.txt) from the token's first file tree,
// writes a summary next to it, and tries a tool its token should not
// grant, to show a refusal.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
)

type toolCall struct {
	Op         string `json:"op"`
	ToolCallID string `json:"tool_call_id"`
	Tool       string `json:"tool"`
	Args       any    `json:"args"`
}

type toolResponse struct {
	ToolCallID string          `json:"tool_call_id"`
	OK         bool            `json:"ok"`
	Result     json.RawMessage `json:"result"`
	Error      string          `json:"error"`
	Message    string          `json:"message"`
	ReceiptID  string          `json:"receipt_id"`
}

func main() {
	fd, err := strconv.Atoi(os.Getenv("CAPKERNEL_IPC_FD"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent: CAPKERNEL_IPC_FD is not set; start me with kernelctl run")
		os.Exit(2)
	}
	ch := os.NewFile(uintptr(fd), "capkernel")
	path := "notes.txt"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	calls := []toolCall{
		{Tool: "fs.read", Args: map[string]any{"path": path}},
		{Tool: "fs.write", Args: map[string]any{"path": "agent-summary.txt", "content": "read " + path + " through capkernel\n"}},
		{Tool: "proc.exec", Args: map[string]any{"argv": []string{"rm", "-rf", "/"}}},
	}
	enc := json.NewEncoder(ch)
	for i := range calls {
		calls[i].Op, calls[i].ToolCallID = "tool_call", fmt.Sprint("call-", i+1)
		if err := enc.Encode(calls[i]); err != nil {
			fmt.Fprintln(os.Stderr, "agent:", err)
			os.Exit(1)
		}
	}
	// Answers come in the order calls finish; tool_call_id says which.
	byID := map[string]toolCall{}
	for _, c := range calls {
		byID[c.ToolCallID] = c
	}
	sc := bufio.NewScanner(ch)
	sc.Buffer(make([]byte, 64<<10), 2<<20)
	failed := 0
	for range calls {
		if !sc.Scan() {
			fmt.Fprintln(os.Stderr, "agent: the channel closed early:", sc.Err())
			os.Exit(1)
		}
		var r toolResponse
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			fmt.Fprintln(os.Stderr, "agent: bad response:", err)
			os.Exit(1)
		}
		c := byID[r.ToolCallID]
		if r.OK {
			fmt.Printf("%s %s: ok %s (receipt %s)\n", r.ToolCallID, c.Tool, r.Result, r.ReceiptID)
		} else {
			failed++
			fmt.Printf("%s %s: refused %s: %s (receipt %s)\n", r.ToolCallID, c.Tool, r.Error, r.Message, r.ReceiptID)
		}
	}
	if failed != 1 {
		os.Exit(1)
	}
}
