// grove viewer: one rollout run — its figures, pass@k per variant, per-task results, infra faults by reason,
// its plots, and every group with links to each attempt's trajectory.
"use strict";

(async () => {
  const { el, path, getJSON, show, kv, badge } = grove;
  const id = document.getElementById("run-id").dataset.id;

  function rows(tbody, list) {
    const frag = document.createDocumentFragment();
    for (const cells of list) frag.append(el("tr", {}, ...cells.map((c) => (c instanceof Node ? el("td", {}, c) : el("td", { text: show(c) })))));
    tbody.replaceChildren(frag);
  }

  // Each variant by its harness and model ("mini-swe-agent 2.4 · gpt-x"); two alike told apart by their index.
  function names(summary) {
    const list = Array.isArray(summary.variants) ? summary.variants : [];
    const labels = list.map((v, i) => {
      const harness = [v && v.harness, v && v.harness_version].filter((x) => x).map(show).join(" ");
      return [harness, v && v.model ? show(v.model) : ""].filter((x) => x).join(" · ") || "variant " + i;
    });
    return labels.map((l, i) => (labels.indexOf(l) !== labels.lastIndexOf(l) ? l + " (#" + i + ")" : l));
  }

  function variants(summary) {
    rows(document.querySelector("#variants tbody"), (summary.variants || []).map((v, i) => [
      String(i), [v.harness, v.harness_version].filter((x) => x).join(" "), v.model, v.attempts, v.scored, v.passed,
      Object.entries(v.pass_at_k || {}).map(([k, p]) => "pass@" + k + " " + show(p)).join(" · "),
      v.groups, v.informative_groups, v.mean_reward]));
  }

  function tasks(summary) {
    const head = document.querySelector("#tasks thead tr");
    for (const name of names(summary)) head.append(el("th", { text: name }));
    rows(document.querySelector("#tasks tbody"), Object.entries(summary.tasks || {}).map(([task, cells]) => [
      el("a", { href: "/ui/trajectories?task_id=" + encodeURIComponent(task) + "&run_id=" + encodeURIComponent(id), text: task }),
      ...(Array.isArray(cells) ? cells : [])]));
  }

  function groups(list, cut, summary) {
    const named = names(summary);
    document.getElementById("group-count").textContent = list.length + (cut ? "+ (the first shown)" : "");
    rows(document.querySelector("#groups tbody"), list.map((g) => {
      const attempts = el("span");
      for (const a of Array.isArray(g.attempts) ? g.attempts : []) {
        const label = "#" + show(a.attempt) + " " + show(a.reward) + " (" + show(a.advantage) + ")";
        attempts.append(a.trajectory_id
          ? el("a", { cls: "attempt", href: path("/ui/trajectories", a.trajectory_id), text: label })
          : el("span", { cls: "attempt", text: label }));
      }
      return [g.task, Number.isInteger(g.variant) && named[g.variant] ? named[g.variant] : show(g.variant), badge(g.informative ? "yes" : "no", g.informative ? "pass" : ""), g.lost_attempts, attempts];
    }));
  }

  try {
    const got = await getJSON(path("/ui/api/runs", id));
    const s = got.summary || {};
    const figures = document.getElementById("figures");
    kv(figures, "Attempts", s.attempts);
    kv(figures, "Tries", s.tries);
    kv(figures, "Lost to infra faults", s.lost_attempts);
    kv(figures, "Groups (informative)", show(s.groups) + " (" + show(s.informative_groups) + ")");
    kv(figures, "Informative per 100 attempts", s.informative_per_100_attempts);
    kv(figures, "Infra fault rate", s.infra_fault_rate);
    kv(figures, "Sandbox seconds", s.sandbox_seconds);
    kv(figures, "CPU seconds", s.cpu_seconds);
    if (!got.summary) grove.showError("this run has no summary.json (yet): only its files are listed");
    variants(s);
    tasks(s);
    rows(document.querySelector("#faults tbody"), Object.entries(s.infra_faults || {}).sort((a, b) => b[1] - a[1]));
    const plots = document.getElementById("plots");
    for (const name of got.plots) {
      const img = document.createElement("img");
      img.setAttribute("alt", name);
      img.setAttribute("src", path("/ui/api/runs", id, "plots", name));
      plots.append(img);
    }
    groups(got.groups, got.groups_cut, s);
  } catch (e) {
    grove.showError(e.message);
  }
})();
