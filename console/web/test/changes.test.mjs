// The bounded diff of an approver's card (src/changes.js). Run: node --test test/
import { test } from "node:test";
import assert from "node:assert/strict";
import * as c from "../src/changes.js";

const lines = (n, prefix) => Array.from({ length: n }, (_, i) => prefix + i).join("\n") + "\n";

test("countLines", () => {
  for (const [text, n] of [["", 0], ["\n", 1], ["a", 1], ["a\n", 1], ["a\nb", 2], ["a\nb\n", 2], ["\n\n", 2]]) {
    assert.equal(c.countLines(text), n, JSON.stringify(text));
  }
});

// Two files of 12,000 distinct lines: unbounded, jsdiff took 22 s here
// and the page froze for 45 s (rev10-approve F1). Bounded, it gives up:
// the edit needs 24,000 lines changed, past MAX_EDIT_LINES, whatever the
// machine's speed.
test("a change too different to diff gives up", () => {
  assert.equal(c.lineChanges(lines(12000, "old line "), lines(12000, "new line ")), null);
  const n = c.MAX_EDIT_LINES / 2 + 1;
  assert.equal(c.lineChanges(lines(n, "old "), lines(n, "new ")), null);
});

// Without the time bound here: on a loaded machine it may cut short
// what is within MAX_EDIT_LINES, which is what the page should do then.
test("a change within the bound is diffed", () => {
  const before = lines(60000, "line ");
  const parts = c.lineChanges(before, before.replace("line 30000\n", "changed\n"), { timeout: Infinity });
  assert.deepEqual(parts.filter((p) => p.added || p.removed).map((p) => [p.added, p.value]), [[false, "line 30000\n"], [true, "changed\n"]]);
  const n = c.MAX_EDIT_LINES / 2 - 1;
  const whole = c.lineChanges(lines(n, "old "), lines(n, "new "), { timeout: Infinity });
  assert.deepEqual(whole.map((p) => [p.added, p.removed, p.count]), [[false, true, n], [true, false, n]]);
});

test("a new or emptied file needs no diff, however long", () => {
  const text = lines(100000, "x");
  assert.deepEqual(c.lineChanges("", text), [{ value: text, added: true, removed: false }]);
  assert.deepEqual(c.lineChanges(text, ""), [{ value: text, added: false, removed: true }]);
  assert.deepEqual(c.lineChanges("", ""), []);
});

test("the rows shown are bounded, the rest counted", () => {
  const { rows, hidden } = c.changeRows([{ value: "a\nb\n" }, { value: lines(6000, "n"), added: true }, { value: "z", removed: true }]);
  assert.equal(rows.length, c.MAX_SHOWN_LINES);
  assert.deepEqual(rows.slice(0, 3), [{ kind: "ctx", text: "a" }, { kind: "ctx", text: "b" }, { kind: "add", text: "n0" }]);
  assert.equal(hidden, 2 + 6000 + 1 - c.MAX_SHOWN_LINES);
  assert.deepEqual(c.changeRows([{ value: "a\n", removed: true }, { value: "b", added: true }]), { rows: [{ kind: "del", text: "a" }, { kind: "add", text: "b" }], hidden: 0 });
  assert.deepEqual(c.firstLines("a\nb\nc", 2), { text: "a\nb\n", hidden: 1 });
  for (const t of ["a\nb\n", "a\nb", "", "a"]) assert.deepEqual(c.firstLines(t, 2), { text: t, hidden: 0 });
  assert.deepEqual(c.firstLines(lines(12001, "new line ")).hidden, 12001 - c.MAX_SHOWN_LINES);
});
