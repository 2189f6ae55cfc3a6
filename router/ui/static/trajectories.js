// grove viewer: search stored trajectories, a page at a time, and pick two to compare.
"use strict";

(() => {
  const { el, path, getJSON, show, badge } = grove;
  const form = document.getElementById("search");
  const body = document.querySelector("#trajectories tbody");
  const more = document.getElementById("more");
  const compare = document.getElementById("compare");
  const picked = [];
  let cursor = null;

  function params(after) {
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (String(v).trim()) q.set(k, String(v).trim());
    if (after) q.set("after", after);
    return q;
  }

  function row(s) {
    const box = el("input", { type: "checkbox" });
    box.addEventListener("change", () => {
      const at = picked.indexOf(s.sandbox_id);
      if (box.checked && at < 0) picked.push(s.sandbox_id);
      if (!box.checked && at >= 0) picked.splice(at, 1);
      compare.disabled = picked.length !== 2;
    });
    const outcome = el("td", {}, s.result ? badge(s.result) : el("span", { cls: "muted", text: "—" }));
    if (s.infra_errors) outcome.append(" ", badge(s.infra_errors + " fault" + (s.infra_errors > 1 ? "s" : ""), "fault"));
    return el("tr", { data: { id: s.sandbox_id } },
      el("td", {}, box),
      el("td", {}, el("a", { href: path("/ui/trajectories", s.sandbox_id), cls: "mono", text: s.sandbox_id })),
      el("td", { text: grove.when(s.created_at) }),
      el("td", { text: show(s.task_id) }),
      el("td", { text: show(s.model) }),
      el("td", { text: [s.harness, s.harness_version].filter((x) => x).join(" ") || "—" }),
      el("td", {}, s.run_id ? el("a", { href: "/ui/trajectories?run_id=" + encodeURIComponent(s.run_id), text: s.run_id, title: "every attempt of this run" }) : "—"),
      outcome,
      el("td", { text: show(s.reward) }),
      el("td", { text: show(s.steps) }));
  }

  async function load(after) {
    grove.showError("");
    try {
      const got = await getJSON("/ui/api/trajectories?" + params(after).toString());
      const rows = document.createDocumentFragment();
      for (const s of got.items) rows.append(row(s));
      if (after) body.append(rows); else body.replaceChildren(rows);
      cursor = got.next;
      more.hidden = !cursor;
      document.getElementById("empty").hidden = body.children.length > 0;
      document.getElementById("scanned").textContent = body.children.length + " shown";
      const table = document.getElementById("trajectories");
      table.dataset.loads = String(Number(table.dataset.loads || 0) + 1);
    } catch (e) {
      grove.showError(e.message);
    }
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    history.replaceState(null, "", "/ui/trajectories?" + params(null).toString());
    load(null);
  });
  more.addEventListener("click", () => load(cursor));
  compare.addEventListener("click", () => {
    if (picked.length === 2) window.location.assign("/ui/compare?a=" + encodeURIComponent(picked[0]) + "&b=" + encodeURIComponent(picked[1]));
  });
  // The filters live in the URL too, so a search can be bookmarked and reloaded.
  for (const [k, v] of new URLSearchParams(window.location.search).entries()) {
    const input = form.elements.namedItem(k);
    if (input) input.value = v;
  }
  load(null);
})();
