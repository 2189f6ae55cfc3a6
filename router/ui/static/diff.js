// grove viewer: a file's text with its line numbers, and a unified diff with the line numbers of both sides.
// The text is a sandbox's: every line is set as text in its own cell, never parsed as markup.
"use strict";

const code = (() => {
  const { el } = grove;
  const HUNK = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/;

  // Lines split at "\n" only (as the router counts them); a final newline ends the last line, not a new one.
  function lines(text) {
    const parts = String(text === null || text === undefined ? "" : text).split("\n");
    if (parts.length && parts[parts.length - 1] === "") parts.pop();
    return parts;
  }

  function row(kind, before, after, text) {
    return el("tr", { cls: kind },
      el("td", { cls: "ln", text: before }), el("td", { cls: "ln", text: after }), el("td", { cls: "src", text: text }));
  }

  // A file's text, numbered from 1.
  function listing(text) {
    const body = el("tbody");
    let n = 1;
    for (const line of lines(text)) body.append(el("tr", {}, el("td", { cls: "ln", text: String(n++) }), el("td", { cls: "src", text: line })));
    return el("table", { cls: "code listing" }, body);
  }

  // A unified diff: hunk by hunk, each line with its old and new numbers; whatever is outside a hunk
  // (a "diff --git" header, "---"/"+++" names, a cut diff's tail) is shown as it is, unnumbered.
  function diff(text) {
    const body = el("tbody");
    let before = 0, after = 0, oldLeft = 0, newLeft = 0;
    for (const line of lines(text)) {
      const hunk = HUNK.exec(line);
      if (hunk) {
        before = Number(hunk[1]); after = Number(hunk[3]);
        oldLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
        newLeft = hunk[4] === undefined ? 1 : Number(hunk[4]);
        body.append(row("hunk", "", "", line));
      } else if (line.startsWith("\\")) {
        body.append(row("note", "", "", line));
      } else if (oldLeft > 0 || newLeft > 0) {
        const sign = line.charAt(0);
        if (sign === "+") { body.append(row("add", "", String(after++), line)); newLeft--; }
        else if (sign === "-") { body.append(row("del", String(before++), "", line)); oldLeft--; }
        else { body.append(row("ctx", String(before++), String(after++), line)); oldLeft--; newLeft--; }
      } else {
        body.append(row("info", "", "", line));
      }
    }
    return el("table", { cls: "code diff" }, body);
  }

  // Lines added and removed by a unified diff (the "+++"/"---" names outside hunks not counted).
  function stat(text) {
    let added = 0, removed = 0, oldLeft = 0, newLeft = 0;
    for (const line of lines(text)) {
      const hunk = HUNK.exec(line);
      if (hunk) {
        oldLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
        newLeft = hunk[4] === undefined ? 1 : Number(hunk[4]);
      } else if (!line.startsWith("\\") && (oldLeft > 0 || newLeft > 0)) {
        const sign = line.charAt(0);
        if (sign === "+") { added++; newLeft--; } else if (sign === "-") { removed++; oldLeft--; } else { oldLeft--; newLeft--; }
      }
    }
    return { added, removed };
  }

  function counts(added, removed) {
    return el("span", { cls: "stat" }, el("span", { cls: "added", text: "+" + added }), " ", el("span", { cls: "removed", text: "−" + removed }));
  }

  return { lines, listing, diff, stat, counts };
})();
