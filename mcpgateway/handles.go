package mcpgateway

import (
	"context"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/runner"
)

// HandleToolPrefix starts the MCP tool name of a handle: the handle
// "/object/<base32>" is the tool "obj_<base32>", since an MCP tool name
// may hold only letters, digits, "_", "-" and ".". The 26 base32
// characters carry the handle's 128 random bits.
const HandleToolPrefix = "obj_"

// handleTool is the MCP tool name of a kernel handle.
func handleTool(h string) string {
	return HandleToolPrefix + strings.TrimPrefix(h, kernel.HandlePrefix)
}

// kernelTool is the tool id the kernel gets for an MCP tool name in
// handle mode: a handle's name maps back to the handle; any other name
// goes as it came, and the kernel answers it as the unknown tool it is
// for a token in handle mode (a raw syscall id included). A name in the
// kernel's own handle form is not one the gateway lists, so it goes under
// one more prefix, which no handle has: it too is unknown.
func kernelTool(name string) string {
	if rest, ok := strings.CutPrefix(name, HandleToolPrefix); ok && rest != "" {
		return kernel.HandlePrefix + rest
	}
	if strings.HasPrefix(name, kernel.HandlePrefix) {
		return kernel.HandlePrefix + name
	}
	return name
}

// handleMode serves tools/list and tools/call of a token in handle mode:
// each MCP session lists its own handles, minted by the kernel for it and
// ended with it.
type handleMode struct {
	src   runner.HandleSource
	mu    sync.Mutex
	seen  map[string]bool // sessions whose end is watched
	stdio string
}

// list answers tools/list with session's handles, and the first time
// watches the session so its handles end with it.
func (h *handleMode) list(ctx context.Context, ss *mcp.ServerSession, session string) (*mcp.ListToolsResult, error) {
	hs, err := h.src.Handles(ctx, session)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	watch := !h.seen[session] && ss != nil && session != h.stdio
	h.seen[session] = true
	h.mu.Unlock()
	if watch {
		go func() {
			_ = ss.Wait()
			h.end(session)
		}()
	}
	out := &mcp.ListToolsResult{Tools: make([]*mcp.Tool, 0, len(hs))}
	for _, d := range hs {
		out.Tools = append(out.Tools, &mcp.Tool{Name: handleTool(d.Handle), Description: d.Description, InputSchema: d.InputSchema})
	}
	return out, nil
}

// end ends session's handles.
func (h *handleMode) end(session string) {
	h.mu.Lock()
	delete(h.seen, session)
	h.mu.Unlock()
	_ = h.src.EndSession(context.Background(), session)
}
