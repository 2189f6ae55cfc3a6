// grove viewer: the rollout runs stored in S3, newest first — when each started, its harnesses and models,
// how many tasks and attempts, and how many of the scored attempts passed.
"use strict";

(async () => {
  const { el, path, getJSON, show } = grove;

  function rate(run) {
    if (typeof run.pass_rate !== "number") return el("span", { cls: "muted", text: "—" });
    const per = (Array.isArray(run.variants) ? run.variants : [])
      .map((v) => [v.harness, v.model].filter((x) => x).map(show).join(" · ") + ": " + show(v.passed) + "/" + show(v.scored))
      .join("\n");
    return el("span", { title: per }, el("strong", { text: Math.round(run.pass_rate * 1000) / 10 + "%" }),
      el("span", { cls: "muted", text: " " + show(run.passed) + "/" + show(run.scored) }));
  }

  function names(list) {
    return Array.isArray(list) && list.length ? list.map(show).join(", ") : "—";
  }

  try {
    const got = await getJSON("/ui/api/runs");
    const rows = document.createDocumentFragment();
    for (const run of got.runs) {
      rows.append(el("tr", { data: { id: run.run_id } },
        el("td", {}, el("a", { href: path("/ui/runs", run.run_id), cls: "mono", text: run.run_id })),
        el("td", { cls: "date", text: grove.when(run.date) }),
        el("td", { cls: "harnesses", text: names(run.harnesses) }),
        el("td", { cls: "models", text: names(run.models) }),
        el("td", { cls: "tasks", text: show(run.tasks) }),
        el("td", { cls: "attempts", text: show(run.attempts) }),
        el("td", { cls: "rate" }, run.summary ? rate(run) : el("span", { cls: "muted", text: "no summary.json (yet)" }))));
    }
    document.querySelector("#runs tbody").replaceChildren(rows);
    document.getElementById("empty").hidden = got.runs.length > 0;
    if (got.cut) document.getElementById("cut").hidden = false;
  } catch (e) {
    grove.showError(e.message);
  }
})();
