// The operator's console page. Everything it shows comes from the
// console API (/console/api/...) and the kernel's public ledger
// endpoints, all on this origin. The session is its key, which the
// sign-in answers with once and this tab keeps in its sessionStorage
// (scoped to this origin, port included, and to this tab), sent in the
// X-Console-Key header of every console API request, together with the
// HttpOnly cookie binding it to this browser. The cookie alone is no
// session: cookies are not scoped by port.
import { verifyBundle, parseEntry, unhex } from "./verify.js";
import { witness } from "./witness.js";
import { openPayload, payloadState, PARTS } from "./commitments.js";
import { lineChanges, changeRows, firstLines, countLines } from "./changes.js";

const $ = (sel) => document.querySelector(sel);
let session = null; // {role, subject, canDecide, can_revoke, reads_all}
let events = null; // the AbortController of the event stream
const KEY = "capkernel.console.key"; // in sessionStorage: this tab's session key
const KEY_HEADER = "X-Console-Key";
const pending = new Map(); // approval_id -> request
const decided = new Map();

// ---- helpers ----

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c !== undefined && c !== null) e.append(c instanceof Node ? c : String(c));
  }
  return e;
}

function say(msg, error = false) {
  const s = $("#status");
  s.textContent = msg;
  s.classList.toggle("error", error);
}

class APIError extends Error {
  constructor(status, body) {
    super((body && body.error) || "HTTP " + status);
    this.status = status;
    this.body = body;
  }
}

// keyHeaders are the headers that carry this tab's session key.
function keyHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { [KEY_HEADER]: key } : {};
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: keyHeaders() };
  if (method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body ?? {});
  }
  const resp = await fetch(path, opts);
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (resp.status === 401 && path !== "/console/api/login" && path !== "/console/api/session") {
    signedOut("The session has ended; sign in again.");
  }
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}

function kv(pairs) {
  const dl = el("dl", { class: "kv" });
  for (const [k, v] of pairs) {
    if (v === undefined || v === null || v === "") continue;
    dl.append(el("dt", {}, k), el("dd", {}, v));
  }
  return dl;
}

function fmtTime(s) {
  if (!s) return "";
  const d = new Date(s);
  return isNaN(d) ? s : d.toLocaleString();
}

// ---- views ----

const views = ["login", "approvals", "history", "verify", "ledger", "tokens"];

function show(view) {
  for (const v of views) $("#view-" + v).hidden = v !== view;
  for (const b of document.querySelectorAll("#nav button")) {
    if (b.dataset.view === view) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  if (view === "tokens") loadTokens();
  if (view === "ledger") refreshCheckpoint();
  if (view === "history" && !$("#history-table tbody").children.length) searchHistory();
}

function signedIn(s) {
  session = { ...s, canDecide: s.can_decide };
  $("#view-login").hidden = true;
  $("#nav").hidden = false;
  $("#who").hidden = false;
  $("#who-text").textContent = `${s.subject} (${s.role})`;
  for (const b of document.querySelectorAll("#nav [data-reads-all]")) b.hidden = !s.reads_all;
  show("approvals");
  loadApprovals();
  connectEvents();
  $("#main").focus();
}

function signedOut(msg) {
  session = null;
  sessionStorage.removeItem(KEY);
  if (events) events.abort();
  events = null;
  pending.clear();
  touched.clear();
  decided.clear();
  $("#nav").hidden = true;
  $("#who").hidden = true;
  show("login");
  if (msg) say(msg, true);
  $("#credential").focus();
}

// ---- approvals ----

// A list fetched by loadApprovals is a snapshot taken some time before it
// arrives; live events seen meanwhile are newer. loads counts the fetches
// and touched holds, per approval, the count current when an event last
// told of it, so a snapshot never undoes what an event said after the
// fetch began (a request shown live must not vanish, a decided one must
// not come back as pending).
let loads = 0;
const touched = new Map(); // approval_id -> loads when an event last told of it

async function loadApprovals() {
  const load = ++loads;
  try {
    const out = await api("GET", "/console/api/approvals?all=true");
    session.canDecide = out.can_decide;
    const listed = new Set();
    for (const a of out.approvals) {
      listed.add(a.approval_id);
      if ((touched.get(a.approval_id) ?? 0) >= load) continue;
      if (a.state === "pending") pending.set(a.approval_id, a);
      else {
        pending.delete(a.approval_id);
        decided.set(a.approval_id, a);
      }
    }
    // Pending before the fetch began and not listed: decided or expired
    // while this console was not listening.
    for (const id of [...pending.keys()]) if (!listed.has(id) && (touched.get(id) ?? 0) < load) pending.delete(id);
    renderApprovals();
  } catch (e) {
    say("Loading approvals failed: " + e.message, true);
  }
}

function renderApprovals() {
  const list = $("#approvals-list");
  const keep = new Set(pending.keys());
  for (const li of [...list.children]) {
    if (keep.has(li.dataset.id)) continue;
    detailWatch.unobserve(li.querySelector(".detail"));
    li.remove();
  }
  for (const a of pending.values()) {
    if (!list.querySelector(`[data-id="${CSS.escape(a.approval_id)}"]`)) list.append(approvalCard(a));
  }
  $("#approvals-empty").hidden = pending.size > 0;
  $("#pending-count").textContent = String(pending.size);
  const dl = $("#decided-list");
  dl.replaceChildren(...[...decided.values()].reverse().slice(0, 50).map(decidedCard));
}

function approvalCard(a) {
  const id = a.approval_id;
  const reasonID = "reason-" + id;
  const li = el("li", { class: "card" + (a.autonomy_mode === "escalated" ? " escalated" : ""), "data-id": id, "aria-labelledby": "h-" + id });
  const detail = el("div", { class: "detail" }, "Loading the arguments…");
  li.append(
    el("h3", { id: "h-" + id }, `${a.tool_id} by ${a.agent_id}`),
    kv([
      ["Session", a.session_id],
      ["Class", a.side_effect],
      ["Mode", a.autonomy_mode + (a.required_role === "escalation" ? " (escalation approvers only)" : "")],
      ["Risk", `${a.risk_score}${a.risk_basis && a.risk_basis.length ? " — " + a.risk_basis.join("; ") : ""}`],
      ["Effects", (a.projected_effects || []).join(", ")],
      ["Policy", a.policy_hash],
      ["Operation", a.operation_id],
      ["Requested", fmtTime(a.requested_at)],
      ["Expires", fmtTime(a.decide_by)],
    ]),
    detail,
  );
  if (session.canDecide) {
    const reason = el("textarea", { id: reasonID, rows: 2 });
    const allow = el("button", { type: "button", class: "allow" }, "Approve");
    const deny = el("button", { type: "button", class: "deny" }, "Deny");
    const decide = async (decision) => {
      allow.disabled = deny.disabled = true;
      try {
        const out = await api("POST", "/console/api/approvals/" + encodeURIComponent(id), { decision, reason: reason.value });
        resolved(out);
        say(`${decision === "allow" ? "Approved" : "Denied"} ${a.tool_id} by ${a.agent_id}.`);
      } catch (e) {
        if (e.status === 409 && e.body && e.body.approval) {
          resolved(e.body.approval);
          say(`Someone decided first: ${e.body.approval.state} by ${e.body.approval.decided_by || "nobody"}.`, true);
        } else {
          allow.disabled = deny.disabled = false;
          say("The decision failed: " + e.message, true);
        }
      }
    };
    allow.addEventListener("click", () => decide("allow"));
    deny.addEventListener("click", () => decide("deny"));
    li.append(el("label", { for: reasonID }, "Reason"), reason, el("div", { class: "buttons" }, allow, deny));
  } else {
    li.append(el("p", { class: "read-only" }, "Read-only: your credential cannot decide approvals."));
  }
  detail.dataset.approval = id;
  detailWatch.observe(detail);
  return li;
}

// detailWatch loads a card's detail (its arguments and the change it
// would make) once the card is on screen or near it, not for every card
// at once: each detail may carry a megabyte and a diff to compute, and
// up to 256 requests of every agent may be pending.
const detailWatch = new IntersectionObserver((seen) => {
  for (const e of seen) {
    if (!e.isIntersecting) continue;
    detailWatch.unobserve(e.target);
    loadDetail(e.target.dataset.approval, e.target);
  }
}, { rootMargin: "200px" });

async function loadDetail(id, box) {
  try {
    const d = await api("GET", "/console/api/approvals/" + encodeURIComponent(id));
    box.replaceChildren(el("h4", {}, "Arguments"), el("pre", {}, JSON.stringify(d.args, null, 2)));
    for (const f of d.files || []) box.append(fileDiff(d.tool_id, d.args, f));
  } catch (e) {
    box.textContent = e.status === 404 ? "Decided already." : "Loading the arguments failed: " + e.message;
  }
}

// fileDiff shows f, a file the call would write or delete, titled with
// where the call acts (and, when it differs, the agent's spelling), and
// the change fs.write or fs.patch would make to it, as a diff bounded by
// changes.js: a change too different to diff here is shown as its new
// content.
function fileDiff(tool, args, f) {
  const spelled = f.spelled ? `, spelled ${f.spelled}` : "";
  const state = f.dir ? "directory" : f.link !== undefined ? "symbolic link" : f.exists ? "now " + f.size + " bytes" : "new file";
  const title = el("h4", {}, `${f.path} (${state}${spelled})`);
  if (f.dir) {
    const more = f.more ? " or more" : "";
    return el("div", {}, title, el("p", { class: "dir" }, `A directory of ${f.entries || 0}${more} entries (at any depth), ${f.size}${more} bytes in files.`));
  }
  if (f.link !== undefined) {
    const note = el("p", {}, `A symbolic link to ${f.link}: the call replaces or removes the link itself, not what it leads to.`);
    if (tool !== "fs.write" || typeof args.content !== "string") return el("div", {}, title, note);
    return el("div", {}, title, note, diffBox(f.path, lineChanges("", args.content)));
  }
  if (f.binary || f.truncated) return el("div", {}, title, el("p", {}, f.truncated ? "Too large to show." : "Not text: no diff."));
  const before = f.exists ? f.content || "" : "";
  let after;
  if (tool === "fs.write" && typeof args.content === "string") after = args.content;
  else if (tool === "fs.patch" && typeof args.old === "string" && typeof args.new === "string") {
    const i = before.indexOf(args.old);
    if (i < 0) return el("div", {}, title, el("p", {}, "The text to replace is not in the current file: the call will fail."));
    after = before.slice(0, i) + args.new + before.slice(i + args.old.length);
  } else {
    return el("div", {}, title, shownText(before));
  }
  const parts = lineChanges(before, after);
  if (!parts) {
    return el("div", {}, title,
      el("p", { class: "too-different" }, `Too different to diff here: ${countLines(before)} lines before, ${countLines(after)} after. The new content:`),
      shownText(after));
  }
  return el("div", {}, title, diffBox(f.path, parts));
}

// diffBox shows the rows of parts (changes.js), at most MAX_SHOWN_LINES.
function diffBox(path, parts) {
  const { rows, hidden } = changeRows(parts);
  const box = el("div", { class: "diff", role: "region", "aria-label": "Diff of " + path });
  for (const r of rows) {
    const sign = r.kind === "add" ? "+" : r.kind === "del" ? "-" : " ";
    box.append(el("div", { class: r.kind }, el("span", { class: "sr-only" }, r.kind === "add" ? "added: " : r.kind === "del" ? "removed: " : ""), sign + " " + r.text));
  }
  return hidden ? el("div", {}, box, el("p", { class: "hidden-lines" }, `${hidden} more lines not shown here (the arguments above hold the whole call).`)) : box;
}

// shownText is text in a <pre>, at most MAX_SHOWN_LINES lines of it.
function shownText(text) {
  const { text: shown, hidden } = firstLines(text);
  const pre = el("pre", { class: "content" }, shown);
  return hidden ? el("div", {}, pre, el("p", { class: "hidden-lines" }, `${hidden} more lines not shown here (the arguments above hold the whole call).`)) : pre;
}

function decidedCard(a) {
  return el("li", { class: "card", "data-id": a.approval_id },
    el("h3", {}, `${a.tool_id} by ${a.agent_id}`),
    el("p", {}, el("span", { class: "state " + a.state }, a.state), a.decided_by ? ` by ${a.decided_by}` : "", a.reason ? ` — ${a.reason}` : ""),
    kv([["Decided", fmtTime(a.decided_at)], ["Approval valid until", fmtTime(a.expires_at)], ["Operation", a.operation_id]]));
}

function resolved(a) {
  touched.set(a.approval_id, loads);
  pending.delete(a.approval_id);
  decided.set(a.approval_id, a);
  renderApprovals();
}

// ---- live events ----

function connectEvents() {
  if (events) events.abort();
  events = new AbortController();
  streamEvents(events.signal);
}

const RECONNECT_MS = 3000; // as EventSource's default

// streamEvents reads the console's event stream (Server-Sent Events)
// with fetch, which sends the session key (EventSource cannot send a
// header), until signal aborts. Like EventSource it reconnects after a
// pause when the stream breaks, and reloads the approvals list whenever
// it (re)opens, as events may have been missed meanwhile. A 401, or the
// stream's "ended" event, signs the page out.
async function streamEvents(signal) {
  while (!signal.aborted) {
    try {
      const resp = await fetch("/console/api/events", { credentials: "same-origin", headers: keyHeaders(), signal });
      if (resp.status === 401) {
        if (!signal.aborted) signedOut("The session has ended; sign in again.");
        return;
      }
      if (resp.ok && resp.body) {
        if (session) loadApprovals();
        await readEvents(resp.body, signal);
      }
    } catch {
      // a broken stream: reconnect below
    }
    if (signal.aborted) return;
    await new Promise((r) => setTimeout(r, RECONNECT_MS));
  }
}

// readEvents parses the stream's events (lines "event:" and "data:",
// a blank line ending each; comments start with ":") and hands each to
// onEvent until the stream ends.
async function readEvents(body, signal) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "", kind = "", data = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done || signal.aborted) return;
    buf += value;
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, "");
      buf = buf.slice(nl + 1);
      if (line === "") {
        if (data.length) onEvent(kind || "message", data.join("\n"));
        kind = "";
        data = [];
      } else if (line.startsWith("event:")) kind = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
  }
}

function onEvent(kind, data) {
  if (kind === "ended") {
    let why = "";
    try {
      why = JSON.parse(data).error;
    } catch {
      // the reason is optional
    }
    signedOut("The session has ended" + (why ? ": " + why : "") + "; sign in again.");
    return;
  }
  if (kind === "dropped") {
    loadApprovals();
    return;
  }
  if (!kind.startsWith("tool.")) return;
  const e = JSON.parse(data);
  logEvent(e);
  if (kind === "tool.confirmation_requested" && e.approval) {
    touched.set(e.approval.approval_id, loads);
    pending.set(e.approval.approval_id, e.approval);
    renderApprovals();
  } else if (kind === "tool.confirmation_resolved" && e.approval) {
    resolved(e.approval);
  }
}

function logEvent(e) {
  const ol = $("#events");
  ol.prepend(el("li", {}, `${e.time} ${e.kind} ${e.tool_id} ${e.agent_id}${e.error_class ? " " + e.error_class : ""}${e.tx_outcome ? " " + e.tx_outcome : ""}`));
  while (ol.children.length > 200) ol.lastChild.remove();
}

// ---- history ----

let historyQuery = null;

function isoOf(local) {
  return local ? new Date(local).toISOString().replace(/\.\d+Z$/, "Z") : "";
}

async function searchHistory(more = false) {
  const f = new FormData($("#history-form"));
  if (!more) {
    historyQuery = new URLSearchParams();
    for (const k of ["agent", "tool", "outcome", "class"]) if (f.get(k)) historyQuery.set(k, f.get(k));
    for (const k of ["since", "until"]) if (f.get(k)) historyQuery.set(k, isoOf(f.get(k)));
    historyQuery.delete("after");
    $("#history-table tbody").replaceChildren();
  }
  try {
    const out = await api("GET", "/console/api/receipts?" + historyQuery);
    const tb = $("#history-table tbody");
    for (const r of out.receipts) {
      const rc = r.receipt;
      const outcome = rc.error_class ? `${rc.error_class} (${rc.tx_outcome})` : rc.tx_outcome;
      const tr = el("tr", { class: "selectable", tabindex: 0, "data-receipt": r.receipt_id },
        el("td", {}, fmtTime(rc.issued_at)), el("td", {}, rc.tool_id), el("td", {}, rc.agent_id), el("td", {}, outcome),
        el("td", {}, rc.autonomy_mode), el("td", {}, el("code", {}, r.receipt_id.slice(0, 13))));
      const open = () => showRecord(r, tr);
      tr.addEventListener("click", open);
      tr.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          open();
        }
      });
      tb.append(tr);
    }
    $("#history-more").hidden = !out.next;
    if (out.next) historyQuery.set("after", out.next);
    say(`${tb.children.length} receipts.`);
  } catch (e) {
    say("Search failed: " + e.message, true);
  }
}

let current = null;

async function showRecord(r, tr) {
  for (const x of document.querySelectorAll("#history-table tr[aria-selected]")) x.removeAttribute("aria-selected");
  tr.setAttribute("aria-selected", "true");
  current = r;
  $("#history-detail").hidden = false;
  $("#detail-id").textContent = r.receipt_id;
  $("#detail-checks").replaceChildren();
  $("#detail-receipt").textContent = JSON.stringify({ jws: r.jws, payload: r.receipt, withheld: r.withheld }, null, 2);
  $("#detail-operation").textContent = "Loading…";
  $("#detail-commitments").replaceChildren();
  $("#detail-commitments").removeAttribute("data-verdict");
  showPayload(r);
  try {
    const op = await api("GET", "/console/api/operations/" + encodeURIComponent(r.operation_id));
    $("#detail-operation").textContent = JSON.stringify(op, null, 2);
  } catch (e) {
    if (e.status === 404 && !(session && session.reads_all)) $("#detail-operation").textContent = "Withheld: the result is the call's payload, which your credential does not read.";
    else $("#detail-operation").textContent = e.status === 404 ? "No stored result (the call was refused before it was recorded as an operation)." : e.message;
  }
}

// ---- payloads and commitments ----

let currentRecord = null; // the Record of the receipt shown

const PART_LABELS = { args: "Arguments", result: "Result", policy_input: "Policy input", context: "Context" };

// showPayload shows the record's payload as the session may read it
// (payloadState): every part kept (auditors, the admin), erased (with the
// erasure record), withheld (another agent's record, for an approver), or
// not kept (depth commitments_only).
async function showPayload(r) {
  const state = $("#detail-payload-state"), box = $("#detail-payload"), er = $("#detail-erasure");
  state.textContent = "Loading…";
  state.removeAttribute("data-state");
  box.replaceChildren();
  er.replaceChildren();
  currentRecord = null;
  try {
    const rec = await api("GET", "/console/api/receipts/" + encodeURIComponent(r.receipt_id) + "/record");
    if (current !== r) return;
    currentRecord = rec;
    const p = rec.entry.payload;
    const { state: st, message: msg } = payloadState(rec);
    if (st === "erased") {
      const b = rec.erasure.body;
      er.append(el("h5", {}, "Erasure record"), kv([["Seq", rec.erasure.seq], ["Time", fmtTime(rec.erasure.time)], ["By", b.by], ["Reason", b.reason],
        ["Operation", b.operation_id], ["Records", (b.seqs || []).join(", ")]]));
    } else if (st === "kept") {
      for (const part of PARTS) {
        if (p[part] !== undefined) box.append(el("h5", {}, PART_LABELS[part]), el("pre", { "data-part": part }, JSON.stringify(p[part], null, 2)));
      }
    }
    state.textContent = msg;
    state.setAttribute("data-state", st);
  } catch (e) {
    state.textContent = "Loading the record failed: " + e.message;
  }
}

// openCurrent checks, in the page, that the record shown is in the log
// (its receipt verified: entry hash, checkpoint, inclusion) and that its
// commitments open with its payload.
async function openCurrent() {
  const box = $("#detail-commitments");
  box.removeAttribute("data-verdict");
  box.textContent = "Checking…";
  const rec = currentRecord;
  if (!rec) {
    box.textContent = "The record has not loaded.";
    return;
  }
  try {
    const bundle = await api("GET", `/console/api/receipts/${encodeURIComponent(current.receipt_id)}/bundle`);
    const proof = await verifyBundle(bundle, await jwks());
    if (!proof.ok) {
      renderChecks(box, proof);
      return;
    }
    // The commitments are read from the verified entry, not from the
    // record the API answered with.
    const body = parseEntry(bundle.entry).body;
    const out = openPayload(body, rec.entry.payload || null, { erased: !!rec.erasure, withheld: !rec.full });
    const states = out.parts.map((p) => p.state);
    let verdict, cls;
    if (out.tampered) {
      cls = "fail";
      verdict = "Tampered: " + out.parts.filter((p) => p.state === "mismatch" || p.state === "missing").map((p) => PART_LABELS[p.part]).join(", ") + " do not open the record's commitments.";
    } else if (states.includes("erased")) {
      cls = "erased";
      verdict = `Erased, not tampered: the record is in the log; its payload was removed by erasure record ${rec.erasure.seq}.`;
    } else if (states.includes("withheld")) {
      cls = "withheld";
      verdict = "The record is in the log; its payload is withheld from your credential, so its commitments cannot be opened here.";
    } else {
      cls = "pass";
      verdict = "Verified: the record is in the log and commits to exactly this payload.";
    }
    const ul = el("ul", { class: "checks" });
    for (const p of out.parts) {
      const c = p.state === "matches" ? "pass" : p.state === "mismatch" || p.state === "missing" ? "fail" : "skip";
      ul.append(el("li", { class: c, "data-part": p.part, "data-state": p.state }, el("strong", {}, `${PART_LABELS[p.part]}: ${p.state.replace("_", " ")}`),
        el("br"), p.commitment ? el("code", {}, p.commitment) : "no commitment", p.detail ? el("br") : "", p.detail));
    }
    box.replaceChildren(el("p", { class: "verdict " + (cls === "fail" ? "fail" : cls === "pass" ? "pass" : "") }, verdict), ul);
    box.setAttribute("data-verdict", cls);
  } catch (e) {
    box.textContent = "The check failed to run: " + e.message;
  }
}

async function jwks() {
  const resp = await fetch("/.well-known/jwks.json", { credentials: "omit" });
  if (!resp.ok) throw new Error("fetching the JWKS: HTTP " + resp.status);
  return resp.json();
}

function renderChecks(box, result) {
  const verdict = el("p", { class: "verdict " + (result.ok ? "pass" : "fail") }, result.ok ? "Verified: every check passed." : "Not verified: " + (result.checks.find((c) => c.ok === false) || {}).label + " failed.");
  const ul = el("ul", { class: "checks" });
  for (const c of result.checks) {
    const state = c.ok === true ? "pass" : c.ok === false ? "fail" : "skip";
    ul.append(el("li", { class: state, "data-check": c.id, "data-state": state }, el("strong", {}, `${state === "pass" ? "✓" : state === "fail" ? "✗" : "–"} ${c.label}`), el("br"), c.detail));
  }
  box.replaceChildren(verdict, ul);
  box.setAttribute("data-verdict", result.ok ? "pass" : "fail");
}

async function verifyCurrent() {
  const box = $("#detail-checks");
  box.textContent = "Verifying…";
  try {
    const bundle = await api("GET", `/console/api/receipts/${encodeURIComponent(current.receipt_id)}/bundle`);
    renderChecks(box, await verifyBundle(bundle, await jwks()));
  } catch (e) {
    box.textContent = "Could not fetch the bundle: " + e.message;
  }
}

// ---- verify an uploaded bundle ----

// readFile returns the bytes of the file chosen in input, or null: the
// verifier decodes them itself, refusing what is not UTF-8.
async function readFile(input) {
  const f = input.files && input.files[0];
  return f ? new Uint8Array(await f.arrayBuffer()) : null;
}

async function verifyUpload(ev) {
  ev.preventDefault();
  const box = $("#verify-checks");
  try {
    // The texts go to the verifier as they are: it parses them strictly
    // (JSON.parse would keep the last of two members of one name).
    const bundle = (await readFile($("#bundle-file"))) ?? $("#bundle-text").value;
    if (bundle.length === 0 || (typeof bundle === "string" && !bundle.trim())) throw new Error("give a bundle file or paste one");
    const keys = await readFile($("#jwks-file"));
    renderChecks(box, await verifyBundle(bundle, keys ?? (await jwks())));
  } catch (e) {
    box.replaceChildren(el("p", { class: "verdict fail", "data-verdict": "fail" }, "Not verified: " + e.message));
    box.setAttribute("data-verdict", "fail");
  }
}

// ---- ledger ----

// refreshCheckpoint verifies the kernel's latest checkpoint in the page:
// signed by the JWKS key its signature names, and consistent with the
// last one this browser verified for that key (witness.js: a key signs
// one ledger, under one origin).
async function refreshCheckpoint() {
  const box = $("#ledger-checks");
  try {
    const resp = await fetch("/v1/ledger/checkpoint", { credentials: "omit" });
    if (!resp.ok) throw new Error("HTTP " + resp.status);
    const cp = await resp.json();
    const prove = async (from, to) => {
      const pr = await fetch(`/v1/ledger/proof/consistency?from=${from}&to=${to}`, { credentials: "omit" });
      if (!pr.ok) throw new Error("fetching the consistency proof: HTTP " + pr.status);
      const p = await pr.json();
      return p.proof.map((h) => unhex(h.slice(7)));
    };
    const { checks } = await witness(cp.note, await jwks(), localStorage, prove);
    $("#checkpoint").replaceChildren(...kv([["Number", cp.number], ["Origin", cp.origin], ["Size", cp.size], ["Root", cp.root], ["Verifier key", cp.verifier_key]]).children);
    box.replaceChildren(el("ul", { class: "checks" }, checks.map(([label, ok, detail]) =>
      el("li", { class: ok === true ? "pass" : ok === false ? "fail" : "skip" }, el("strong", {}, label), el("br"), detail))));
  } catch (e) {
    box.replaceChildren(el("p", { class: "verdict fail" }, "Checkpoint not verified: " + e.message));
  }
}

// ---- tokens ----

async function loadTokens() {
  if (!session || !session.reads_all) return;
  try {
    const out = await api("GET", "/console/api/tokens");
    const tb = $("#tokens-table tbody");
    tb.replaceChildren(...out.tokens.map((t) => {
      const budgets = Object.keys(t.limits || {}).sort().map((b) => `${b}: ${t.used[b]} / ${t.limits[b]}, ${t.left[b]} left`).join("; ") || "unlimited";
      const expired = t.exp * 1000 < Date.now();
      const state = t.revoked ? "revoked" : expired ? "expired" : "live";
      const revoke = el("button", { type: "button", class: "danger", "aria-label": `Revoke token ${t.jti} of ${t.agent_id}` }, "Revoke");
      revoke.disabled = t.revoked;
      revoke.hidden = !session.can_revoke; // auditors read tokens, only the admin revokes
      revoke.addEventListener("click", () => askRevoke(t.jti));
      return el("tr", { "data-jti": t.jti },
        el("td", {}, el("code", {}, t.jti), t.parent ? el("div", {}, "from ", el("code", {}, t.parent)) : "", t.role ? el("div", {}, "role " + t.role) : ""),
        el("td", {}, t.agent_id), el("td", {}, new Date(t.exp * 1000).toLocaleString()), el("td", {}, budgets), el("td", {}, state), el("td", {}, revoke));
    }));
  } catch (e) {
    say("Loading tokens failed: " + e.message, true);
  }
}

let revoking = null;

function askRevoke(jti) {
  revoking = jti;
  $("#revoke-jti").textContent = jti;
  $("#revoke-reason").value = "";
  $("#revoke-dialog").showModal();
  $("#revoke-reason").focus();
}

async function confirmRevoke(ev) {
  ev.preventDefault();
  const reason = $("#revoke-reason").value.trim();
  if (!reason) return;
  $("#revoke-dialog").close();
  try {
    await api("POST", `/console/api/tokens/${encodeURIComponent(revoking)}/revoke`, { reason });
    say(`Token ${revoking} revoked.`);
    loadTokens();
  } catch (e) {
    say("Revoking failed: " + e.message, true);
  }
}

// ---- start ----

async function login(ev) {
  ev.preventDefault();
  const input = $("#credential");
  const credential = input.value;
  input.value = ""; // the page keeps no copy of the credential
  try {
    const { key, ...s } = await api("POST", "/console/api/login", { credential });
    sessionStorage.setItem(KEY, key);
    signedIn(s);
    say("Signed in.");
  } catch (e) {
    say("Sign-in failed: " + e.message, true);
    input.focus();
  }
}

async function logout() {
  try {
    await api("POST", "/console/api/logout", {});
  } catch {
    // signed out either way
  }
  signedOut();
  say("Signed out.");
}

function start() {
  $("#login-form").addEventListener("submit", login);
  $("#logout").addEventListener("click", logout);
  for (const b of document.querySelectorAll("#nav button")) b.addEventListener("click", () => show(b.dataset.view));
  $("#history-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    searchHistory();
  });
  $("#history-more").addEventListener("click", () => searchHistory(true));
  $("#detail-verify").addEventListener("click", verifyCurrent);
  $("#detail-open").addEventListener("click", openCurrent);
  $("#verify-form").addEventListener("submit", verifyUpload);
  $("#ledger-refresh").addEventListener("click", refreshCheckpoint);
  $("#tokens-refresh").addEventListener("click", loadTokens);
  $("#revoke-form").addEventListener("submit", confirmRevoke);
  $("#revoke-cancel").addEventListener("click", () => $("#revoke-dialog").close());
  // A tab with no session key has no session: the cookie alone is none.
  if (sessionStorage.getItem(KEY)) api("GET", "/console/api/session").then(signedIn, () => signedOut());
  else signedOut();
}

start();
