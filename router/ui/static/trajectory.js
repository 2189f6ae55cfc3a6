// grove viewer: one trajectory — metadata, outcome with infra faults apart, the attempt's final diff, and its
// steps by phase; a GUI trajectory's screens as a filmstrip above them.
"use strict";

(() => {
  const container = document.getElementById("timeline");
  const id = container.dataset.id;
  let shown = false;
  filmstrip.mount(document.getElementById("filmstrip"), id);
  timeline.mount(container, id, {
    follow: false,
    onHeader: (body) => {
      if (shown) return;
      shown = true;
      timeline.sandboxMeta(document.getElementById("meta"), body.sandbox || {});
      const result = timeline.outcome(document.getElementById("outcome"), body.outcome);
      const badge = document.getElementById("result");
      badge.textContent = result || (body.live ? "live" : "no outcome");
      badge.className = "badge " + (result || "");
      document.getElementById("step-count").textContent = body.step_count + " steps";
      if (body.changes && Number.isInteger(body.changes.i)) {
        // The whole event (the outline clips long diffs), drawn above the steps.
        grove.getJSON(timeline.api(id, "steps", body.changes.i))
          .then((step) => changes.render(document.getElementById("changes"), step.data || {}))
          .catch((e) => grove.showError("could not load the final diff: " + e.message));
      }
      const task = body.sandbox ? body.sandbox.task_id : null;
      if (typeof task === "string" && task) {
        // Other attempts at the task: tick one there and this one to see them side by side.
        const link = grove.el("a", { href: "/ui/trajectories?task_id=" + encodeURIComponent(task), id: "same-task", text: "Other attempts at this task" });
        document.querySelector(".titlebar .actions").prepend(link);
      }
    },
  });
})();
