// grove viewer: one trajectory — metadata, outcome with infra faults apart, and its steps.
"use strict";

(() => {
  const container = document.getElementById("timeline");
  const id = container.dataset.id;
  let shown = false;
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
      const task = body.sandbox ? body.sandbox.task_id : null;
      if (typeof task === "string" && task) {
        // Other attempts at the task: tick one there and this one to see them side by side.
        const link = grove.el("a", { href: "/ui/trajectories?task_id=" + encodeURIComponent(task), id: "same-task", text: "Other attempts at this task" });
        document.querySelector(".titlebar .actions").prepend(link);
      }
    },
  });
})();
