// grove viewer: the live sandboxes, refreshed every few seconds, filtered in the page.
"use strict";

(() => {
  const { el, path, getJSON, show, badge } = grove;
  const body = document.querySelector("#sandboxes tbody");
  const filters = ["status", "image", "task", "model", "harness"].map((name) => document.getElementById("f-" + name));
  let last = { now: 0, sandboxes: [] };

  function fields(sb) {
    return { status: sb.status, image: sb.image, task: sb.task_id, model: sb.model, harness: sb.harness };
  }

  function matches(sb) {
    const f = fields(sb);
    return filters.every((input) => {
      const wanted = input.value.trim().toLowerCase();
      const key = input.id.slice(2);
      if (!wanted) return true;
      const have = String(f[key] || "").toLowerCase();
      return input.tagName === "SELECT" ? have === wanted : have.includes(wanted);
    });
  }

  function render() {
    const shown = last.sandboxes.filter(matches);
    const rows = document.createDocumentFragment();
    for (const sb of shown) {
      const meta = sb;  // the record's shape: metadata flat on the sandbox
      const res = sb.resources || {};
      rows.append(el("tr", { data: { id: sb.id } },
        el("td", {}, el("a", { href: path("/ui/sandboxes", sb.id), cls: "mono", text: sb.id })),
        el("td", {}, badge(sb.status)),
        el("td", { cls: "mono", text: show(sb.image) }),
        el("td", { text: show(meta.task_id) }),
        el("td", { text: show(meta.model) }),
        el("td", { text: [meta.harness, meta.harness_version].filter((x) => x).join(" ") || "—" }),
        el("td", { text: grove.ago(last.now - sb.created_at) }),
        el("td", { text: grove.ago(last.now - sb.last_activity) + " ago" }),
        el("td", { text: show(res.cpu) + " cpu · " + show(res.memory_mb) + " MB" })));
    }
    body.replaceChildren(rows);
    document.getElementById("count").textContent = shown.length + " of " + last.sandboxes.length;
    document.getElementById("empty").hidden = shown.length > 0;
  }

  async function refresh() {
    try {
      last = await getJSON("/ui/api/sandboxes");
      grove.showError("");
      render();
      document.getElementById("refreshed").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      grove.showError(e.message);
    }
    setTimeout(refresh, 2000);
  }

  for (const input of filters) input.addEventListener("input", render);
  document.getElementById("filters").addEventListener("submit", (e) => e.preventDefault());
  refresh();
})();
