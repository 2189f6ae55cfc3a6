// grove viewer: two trajectories side by side, step i of one beside step i of the other.
"use strict";

(() => {
  const { el, getJSON, path } = grove;
  const root = document.getElementById("compare");
  const ids = [root.dataset.a, root.dataset.b];
  const tbody = document.querySelector("#aligned tbody");
  const more = document.getElementById("more");
  let offset = 0;
  let total = 0;

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
  }

  async function load() {
    try {
      const got = await Promise.all(ids.map((id) => getJSON(timeline.api(id) + "?offset=" + offset + "&limit=" + timeline.PAGE)));
      if (offset === 0) { side("a", ids[0], got[0]); side("b", ids[1], got[1]); }
      total = Math.max(got[0].step_count, got[1].step_count);
      const count = Math.max(got[0].steps.length, got[1].steps.length);
      const rows = document.createDocumentFragment();
      for (let k = 0; k < count; k++) {
        const cells = got.map((g, j) => el("td", {}, g.steps[k] ? timeline.renderStep(ids[j], g.steps[k]) : el("span", { cls: "muted", text: "—" })));
        rows.append(el("tr", {}, el("td", { cls: "idx", text: String(offset + k) }), ...cells));
      }
      tbody.append(rows);
      offset += count;
      more.hidden = offset >= total;
    } catch (e) {
      grove.showError(e.message);
    }
  }

  if (!ids[0] || !ids[1]) grove.showError("pick two trajectories on the Trajectories page (?a=…&b=…)");
  else { more.addEventListener("click", load); load(); }
})();
