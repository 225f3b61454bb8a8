// The change a call would make to a file, as an approver's card shows
// it: a line diff of the file's current text and the text the call would
// leave, bounded so that no call can make the page unresponsive.
//
// jsdiff's diffLines (Myers) costs about the square of the number of
// lines changed, on the page's only thread: for two files of 12,000
// distinct lines each it took 22 s in node and froze an approver's page
// for 45 s in Chromium (rev10-approve F1), and an agent chooses what it
// writes. Bounded at MAX_EDIT_LINES changed lines it gives up after about
// 0.2 s; DIFF_TIMEOUT_MS bounds it on a slower machine too.
import { diffLines } from "diff";

// MAX_EDIT_LINES is the most lines added plus removed that lineChanges
// diffs; past it the change is too different to diff here.
export const MAX_EDIT_LINES = 2000;

// DIFF_TIMEOUT_MS is the most time lineChanges spends diffing; past it
// the change is too different to diff here, whatever its size.
export const DIFF_TIMEOUT_MS = 300;

// MAX_SHOWN_LINES is the most lines of one file's change the page puts in
// the document (each is an element); the rest are counted, not shown.
export const MAX_SHOWN_LINES = 5000;

// countLines is the number of lines of text: "" has none, and a last line
// without a newline counts.
export function countLines(text) {
  if (text === "") return 0;
  let n = 1;
  for (let i = text.indexOf("\n"); i >= 0 && i < text.length - 1; i = text.indexOf("\n", i + 1)) n++;
  return n;
}

// lineChanges returns the change from before to after as jsdiff's
// diffLines parts ({value, added, removed}), or null when it is too
// different to diff within MAX_EDIT_LINES and timeout milliseconds
// (default DIFF_TIMEOUT_MS). A text from or to nothing (a new file, an
// emptied one) needs no diff and is never too different.
export function lineChanges(before, after, { timeout = DIFF_TIMEOUT_MS } = {}) {
  if (before === "" && after === "") return [];
  if (before === "") return [{ value: after, added: true, removed: false }];
  if (after === "") return [{ value: before, added: false, removed: true }];
  return diffLines(before, after, { maxEditLength: MAX_EDIT_LINES, timeout }) ?? null;
}

// changeRows splits parts into the rows the page shows, {kind: "add",
// "del" or "ctx", text}, at most max of them; hidden counts the lines
// left out.
export function changeRows(parts, max = MAX_SHOWN_LINES) {
  const rows = [];
  let hidden = 0;
  for (const part of parts) {
    const kind = part.added ? "add" : part.removed ? "del" : "ctx";
    const lines = part.value.replace(/\n$/, "").split("\n");
    const room = Math.max(0, max - rows.length);
    for (const text of lines.slice(0, room)) rows.push({ kind, text });
    hidden += Math.max(0, lines.length - room);
  }
  return { rows, hidden };
}

// firstLines is at most max lines of text, and how many more it has.
export function firstLines(text, max = MAX_SHOWN_LINES) {
  let end = -1;
  for (let n = 0; n < max; n++) {
    end = text.indexOf("\n", end + 1);
    if (end < 0 || end === text.length - 1) return { text, hidden: 0 };
  }
  return { text: text.slice(0, end + 1), hidden: countLines(text) - max };
}
