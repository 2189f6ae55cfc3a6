// grove viewer: a trajectory's phases — setup, the agent's turn, grading — as the router reads them from the
// record's bracket events (each step outline carries its phase, the header the segments). Steps go into one
// box per segment: setup and the agent's turn under a heading (when the record has phases at all), grading
// folded into one line saying how many steps, opened on a click.
"use strict";

const phases = (() => {
  const { el, path, show } = grove;
  const NAMES = { setup: "Setup", agent: "Agent", grading: "Grading" };

  // What a phase's heading says: its name, its steps, and for grading how and with what verdict.
  function label(seg, grader, before) {
    const n = seg.end - seg.start;
    // The agent's phase is "the rest": what is posted after grading is not the agent at work.
    const name = seg.phase === "agent" && before && before.phase === "grading" ? "After grading" : NAMES[seg.phase] || show(seg.phase);
    const parts = [name, n + " step" + (n === 1 ? "" : "s")];
    if (seg.mode !== undefined) parts.push(show(seg.mode));
    if (seg.result !== undefined) parts.push("result " + show(seg.result));
    if (seg.reward !== undefined) parts.push("reward " + show(seg.reward));
    if (seg.phase === "grading" && grader) parts.push("its steps are in the grader's trajectory");
    return parts.join(" · ");
  }

  // The boxes of one timeline: update() with each page's header, boxFor(step) for where a step goes.
  function boxes(container) {
    const made = new Map();
    let segs = [], k = 0, grader = null;

    function update(body) {
      segs = Array.isArray(body.phases) ? body.phases : [];
      grader = body.changes && typeof body.changes.grader === "string" ? body.changes.grader : null;
      container.classList.toggle("phased", segs.some((s) => s.phase !== "agent"));
      segs.forEach((seg, j) => {
        const box = made.get(seg.start);
        if (box) box.head.textContent = label(seg, grader, segs[j - 1]);
      });
    }

    function boxFor(step) {
      // Steps come in order: the segment pointer only moves on (back to the start for an earlier step).
      if (k >= segs.length || step.i < segs[k].start) k = 0;
      while (k < segs.length - 1 && step.i >= segs[k].end) k++;
      const seg = segs[k] && step.i >= segs[k].start && step.i < segs[k].end ? segs[k]
        : { phase: step.phase || "agent", start: -1, end: -1 };
      let box = made.get(seg.start);
      if (!box) {
        const phase = NAMES[seg.phase] ? seg.phase : "agent";
        const head = el(phase === "grading" ? "summary" : "div", { cls: "phase-head", text: label(seg, grader, segs[k - 1]) });
        const node = el(phase === "grading" ? "details" : "section", { cls: "phase " + phase, data: { phase: phase, start: seg.start } }, head);
        if (phase === "grading" && grader) {
          node.append(el("p", { cls: "muted" }, "Graded in another sandbox: ",
            el("a", { href: path("/ui/trajectories", grader), cls: "mono", text: grader })));
        }
        container.append(node);
        box = { node, head };
        made.set(seg.start, box);
      }
      return box.node;
    }

    return { update, boxFor };
  }

  return { NAMES, label, boxes };
})();
