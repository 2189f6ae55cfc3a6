// grove viewer: an attempt's final diff — the "changes" event a rollout records after the agent is done:
// every file changed since setup, its diff (or, binary, its size and hash), and whether grading took it or
// dropped it, and why. Every field is the record's and untrusted: set as text, links only by encoded id.
"use strict";

const changes = (() => {
  const { el, path, show, badge } = grove;
  const BIG_DIFF = 400;  // lines: a longer diff starts folded
  const STATUSES = ["added", "modified", "deleted", "mode"];

  function files(data) {
    const list = data && Array.isArray(data.files) ? data.files : [];
    return list.filter((f) => f && typeof f === "object");
  }

  function mode(value) {
    return typeof value === "number" && Number.isInteger(value) && value >= 0 ? value.toString(8) : "—";
  }

  function grading(data, short) {
    const how = data.grading === "isolated" ? "graded in a fresh sandbox (isolated)"
      : data.grading === "in-place" ? "graded in place" : "grading " + show(data.grading);
    const out = el("span", { cls: "grading" }, how);
    if (typeof data.grader === "string" && data.grader) {
      out.append(" · ", el("a", { cls: "grader mono", href: path("/ui/trajectories", data.grader),
        text: short ? data.grader : "the grader's trajectory (" + data.grader + ")", title: "the grading's own steps" }));
    }
    return out;
  }

  function verdict(f) {
    if (f.applied === true) return badge("applied", "pass");
    const why = f.dropped === null || f.dropped === undefined ? "not applied" : String(f.dropped);
    return el("span", { cls: "dropped" }, badge("dropped", "fault"), " ", el("span", { cls: "why", text: why }));
  }

  function headline(f) {
    const status = typeof f.status === "string" ? f.status : show(f.status);
    const parts = [el("span", { cls: "badge status" + (STATUSES.includes(status) ? " " + status : ""), text: status }),
      el("code", { cls: "path", text: show(f.path) + (f.kind === "dir" ? "/" : "") })];
    if (f.kind === "symlink") parts.push(el("span", { cls: "muted mono", text: "→ " + show(f.target) }));
    if (typeof f.mode_before === "number" && typeof f.mode_after === "number" && f.mode_before !== f.mode_after) {
      parts.push(el("span", { cls: "muted mono", text: "mode " + mode(f.mode_before) + " → " + mode(f.mode_after) }));
    }
    if (typeof f.diff === "string" && f.diff) {
      const s = code.stat(f.diff);
      parts.push(code.counts(s.added, s.removed));
    }
    parts.push(verdict(f));
    return parts;
  }

  function body(f) {
    const box = el("div", { cls: "change-body" });
    if (typeof f.diff === "string" && f.diff) box.append(code.diff(f.diff));
    else if (f.kind === "symlink") box.append(el("div", { cls: "facts" }, el("span", { cls: "mono", text: "symlink → " + show(f.target) })));
    else if (f.kind === "dir") box.append(el("div", { cls: "muted", text: "a directory" }));
    else if (f.binary === true) {
      box.append(el("div", { cls: "facts" }, el("span", { text: "binary" }), el("span", { text: grove.bytes(f.size) }),
        el("span", { cls: "mono", text: "sha256 " + show(f.sha256) })));
    } else if (f.status === "deleted") box.append(el("div", { cls: "muted", text: "deleted" }));
    else if (f.status === "mode") box.append(el("div", { cls: "muted", text: "only its mode changed" }));
    else {
      box.append(el("div", { cls: "facts" }, el("span", { text: "no diff recorded" }), el("span", { text: grove.bytes(f.size) }),
        f.sha256 ? el("span", { cls: "mono", text: "sha256 " + show(f.sha256) }) : null));
    }
    if (f.diff_truncated === true) box.append(el("div", { cls: "muted cut", text: "(the diff was cut when it was recorded: the rest is not in the record)" }));
    return box;
  }

  // The whole final diff: a line on how it was graded, then each file, open unless long, dropped or `folded`.
  function render(container, data, opts) {
    const o = opts || {};
    const list = files(data);
    const applied = list.filter((f) => f.applied === true).length;
    container.textContent = "";
    container.append(el("h2", {}, "Final diff ",
      el("span", { cls: "count", text: list.length + " file" + (list.length === 1 ? "" : "s") + " against the state " +
        (typeof data.base === "string" ? data.base : "after setup") + " · " + applied + " applied · " + (list.length - applied) + " dropped" })));
    container.append(el("div", { cls: "facts" }, grading(data, false)));
    if (!list.length) container.append(el("p", { cls: "muted", text: "The agent changed no file." }));
    for (const f of list) {
      const lines = typeof f.diff === "string" ? code.lines(f.diff).length : 0;
      const item = el("details", { cls: "change " + (f.applied === true ? "applied" : "dropped"), data: { path: show(f.path) } },
        el("summary", {}, ...headline(f)), body(f));
      item.open = !o.folded && f.applied === true && lines <= BIG_DIFF;
      container.append(item);
    }
    container.hidden = false;
  }

  // One line per file, for the step in the timeline (the outline's copy, its diffs clipped: not shown).
  function brief(data) {
    const list = files(data);
    const box = el("div", { cls: "changes-brief" }, el("div", { cls: "facts" },
      el("span", { text: list.length + " file" + (list.length === 1 ? "" : "s") + " changed since setup" }), grading(data, true)));
    const ul = el("ul");
    for (const f of list) ul.append(el("li", {}, ...headline(f)));
    box.append(ul);
    return box;
  }

  return { render, brief };
})();
