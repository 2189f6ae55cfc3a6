// grove viewer: two trajectories side by side, aligned by phase — setup beside setup, the agent's steps beside
// the agent's, grading beside grading (folded until opened) — and within a phase its k-th step beside the
// other's k-th. Each side's final diff sits in its box above.
"use strict";

(() => {
  const { el, getJSON, path, show } = grove;
  const root = document.getElementById("compare");
  const ids = [root.dataset.a, root.dataset.b];
  const table = document.getElementById("aligned");
  const more = document.getElementById("more");
  const PAGED = ["setup", "agent"];  // shown a page at a time; grading only when opened
  let heads = [];
  let at = 0, row = 0;  // the next row to show: phase PAGED[at], its row-th step
  const sections = {};

  function url(id, phase, offset, limit) {
    return timeline.api(id) + "?phase=" + phase + "&offset=" + offset + "&limit=" + limit;
  }

  function count(j, phase) {
    const c = heads[j].phase_counts || {};
    return Number.isInteger(c[phase]) ? c[phase] : 0;
  }

  function side(which, id, body) {
    const box = document.getElementById("side-" + which);
    box.textContent = "";
    box.append(el("h2", {}, el("a", { href: path("/ui/trajectories", id), cls: "mono", text: id })));
    const meta = el("div", { cls: "meta" });
    timeline.sandboxMeta(meta, body.sandbox || {});
    const out = el("div", { cls: "outcome" });
    timeline.outcome(out, body.outcome);
    box.append(meta, out);
    document.getElementById("head-" + which).textContent = id;
    if (body.changes && Number.isInteger(body.changes.i)) {
      const diff = el("section", { cls: "changes", id: "changes-" + which });
      box.append(diff);
      getJSON(timeline.api(id, "steps", body.changes.i))
        .then((step) => changes.render(diff, step.data || {}, { folded: true }))
        .catch((e) => grove.showError("could not load the final diff of " + id + ": " + e.message));
    }
  }

  // What one side did in a phase: its steps, and for grading how it went.
  function sideLabel(j, phase) {
    const n = count(j, phase);
    const parts = [(j ? "B" : "A") + ": " + n + " step" + (n === 1 ? "" : "s")];
    const seg = (Array.isArray(heads[j].phases) ? heads[j].phases : []).find((s) => s.phase === phase);
    if (seg && phase === "grading") {
      const facts = [seg.mode, seg.result !== undefined ? "result " + show(seg.result) : undefined].filter((x) => x !== undefined);
      if (facts.length) parts.push("(" + facts.map(show).join(", ") + ")");
    }
    return parts.join(" ");
  }

  function section(phase) {
    const title = el("th", { text: phases.NAMES[phase] + " — " + sideLabel(0, phase) + " · " + sideLabel(1, phase) });
    title.setAttribute("colspan", "3");
    const body = el("tbody", { cls: "phase " + phase, data: { phase: phase } }, el("tr", { cls: "phase-row" }, title));
    if (phase === "grading") {
      // Folded: the grader's steps say nothing of the policy; the reader opens them when they matter.
      body.classList.add("folded");
      const open = el("button", { cls: "unfold", type: "button", id: "open-grading", text: "Show the grading steps" });
      let loaded = false;
      open.addEventListener("click", async () => {
        const folded = body.classList.toggle("folded");
        open.textContent = folded ? "Show the grading steps" : "Fold the grading steps";
        if (folded || loaded) return;
        loaded = true;
        const total = Math.max(count(0, phase), count(1, phase));
        try {
          for (let from = 0; from < total; from += timeline.PAGE) await rows(phase, from, Math.min(timeline.PAGE, total - from));
        } catch (e) {
          grove.showError(e.message);
        }
      });
      title.append(" ", open);
    }
    table.append(body);
    sections[phase] = body;
  }

  async function rows(phase, from, n) {
    const got = await Promise.all(ids.map((id, j) => (from < count(j, phase) ? getJSON(url(id, phase, from, n)) : { steps: [] })));
    const frag = document.createDocumentFragment();
    for (let k = 0; k < n; k++) {
      const cells = got.map((g, j) => el("td", {}, g.steps[k] ? timeline.renderStep(ids[j], g.steps[k]) : el("span", { cls: "muted", text: "—" })));
      frag.append(el("tr", { cls: "pair", data: { phase: phase, row: from + k } }, el("td", { cls: "idx", text: String(from + k) }), ...cells));
    }
    sections[phase].append(frag);
  }

  // The next page of rows: the rest of setup, then the agent's, PAGE at most.
  async function load() {
    more.disabled = true;
    try {
      let budget = timeline.PAGE;
      while (at < PAGED.length && budget > 0) {
        const phase = PAGED[at];
        const total = Math.max(count(0, phase), count(1, phase));
        if (row >= total) { at++; row = 0; continue; }
        const n = Math.min(budget, total - row);
        await rows(phase, row, n);
        row += n;
        budget -= n;
      }
    } catch (e) {
      grove.showError(e.message);
    }
    more.disabled = false;
    more.hidden = at >= PAGED.length;
  }

  async function start() {
    try {
      heads = await Promise.all(ids.map((id) => getJSON(timeline.api(id) + "?limit=0")));
    } catch (e) {
      grove.showError(e.message);
      return;
    }
    side("a", ids[0], heads[0]);
    side("b", ids[1], heads[1]);
    for (const phase of ["setup", "agent", "grading"]) if (count(0, phase) || count(1, phase)) section(phase);
    await load();
  }

  if (!ids[0] || !ids[1]) grove.showError("pick two trajectories on the Trajectories page (?a=…&b=…)");
  else { more.addEventListener("click", load); start(); }
})();
