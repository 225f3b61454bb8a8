// The official MCP TypeScript SDK as a client of `kernelctl mcp`, for the
// Go tests (cmd/kernelctl/mcp_ts_test.go). Usage:
//
//   node client.mjs stdio <scenario> <kernelctl> <mcp args…>
//   node client.mjs http  <scenario> <url>
//
// It prints one JSON line per step ({"step": …, …}) and exits 0, or
// prints {"error": …} and exits 1. Scenarios:
//   basic     list the tools and call echo
//   gated     call fs.write of Makefile (an approver must decide) with a
//             request timeout of TIMEOUT_MS (env) that progress
//             notifications reset; the call must outlive the timeout
//   large     read BIG (env) with fs.read, then call echo on the same
//             connection
//   elicit    declare the elicitation capability, answer every question
//             "allow" with reason "ok from the TypeScript client", and call
//             fs.write of notes2.txt (a call the policy lets the session
//             confirm)
//   origin    (http) POST initialize with a foreign Origin; print the status
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const [mode, scenario, target, ...rest] = process.argv.slice(2);
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

async function main() {
  if (scenario === "origin") {
    const res = await fetch(target, {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream", origin: "https://evil.example" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "t", version: "1" } } }),
    });
    out({ step: "origin", status: res.status });
    return;
  }
  const transport = mode === "stdio"
    ? new StdioClientTransport({ command: target, args: rest, stderr: "inherit" })
    : new StreamableHTTPClientTransport(new URL(target));
  const elicit = scenario === "elicit";
  const client = new Client({ name: "capkernel-ts-test", version: "1" }, elicit ? { capabilities: { elicitation: { form: {} } } } : undefined);
  const asked = [];
  if (elicit) {
    client.setRequestHandler(ElicitRequestSchema, async (req) => {
      asked.push(req.params.message);
      return { action: "accept", content: { decision: "allow", reason: "ok from the TypeScript client" } };
    });
  }
  let closed = false;
  client.onclose = () => { closed = true; };
  await client.connect(transport);
  out({ step: "connected", protocol: transport.protocolVersion ?? null });
  const text = (r) => r.content.filter((c) => c.type === "text").map((c) => c.text).join("");

  switch (scenario) {
    case "basic": {
      const { tools } = await client.listTools();
      out({ step: "tools", names: tools.map((t) => t.name).sort() });
      const r = await client.callTool({ name: "echo", arguments: { text: "hi" } });
      out({ step: "echo", isError: !!r.isError, text: text(r), meta: r._meta ?? null, structured: r.structuredContent ?? null });
      break;
    }
    case "gated": {
      const timeout = Number(process.env.TIMEOUT_MS);
      let progress = 0;
      const start = Date.now();
      const r = await client.callTool({ name: "fs.write", arguments: { path: "Makefile", content: "approved\n" } }, undefined,
        { timeout, resetTimeoutOnProgress: true, onprogress: () => { progress++; } });
      out({ step: "gated", isError: !!r.isError, text: text(r), progress, elapsedMs: Date.now() - start, timeoutMs: timeout });
      break;
    }
    case "large": {
      const r = await client.callTool({ name: "fs.read", arguments: { path: process.env.BIG } });
      out({ step: "large", isError: !!r.isError, bytes: text(r).length, items: r.content.length, structured: r.structuredContent !== undefined });
      const e = await client.callTool({ name: "echo", arguments: { text: "after" } });
      out({ step: "after", isError: !!e.isError, text: text(e), closed });
      break;
    }
    case "elicit": {
      const r = await client.callTool({ name: "fs.write", arguments: { path: "notes2.txt", content: "confirmed\n" } });
      out({ step: "elicit", isError: !!r.isError, text: text(r), asked, meta: r._meta ?? null });
      break;
    }
    default:
      throw new Error(`unknown scenario ${scenario}`);
  }
  await client.close();
}

main().then(() => process.exit(0), (err) => { out({ error: String(err?.message ?? err) }); process.exit(1); });
