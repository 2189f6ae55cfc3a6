// grove viewer: a trajectory's lineage tree — the sandbox it branched from (fork, restore or replay, at which step),
// its siblings and its own branches, each a link that opens that branch. Drawn only when there is a tree.
"use strict";

(() => {
  const section = document.getElementById("lineage");
  if (!section) return;
  const id = section.dataset.id;

  function label(node) {
    const parts = [];
    if (node.kind) parts.push(node.kind + (Number.isInteger(node.step) ? " at step " + node.step : ""));
    if (node.checkpoint) parts.push("checkpoint " + node.checkpoint);
    return parts.join(", ");
  }

  function item(node, kids) {
    const current = node.id === id;
    const link = grove.el("a", { href: grove.path("/ui/trajectories", node.id), cls: "lineage-link" + (current ? " current" : ""), text: node.id });
    if (current) link.setAttribute("aria-current", "page");
    const li = grove.el("li", { data: { id: node.id } }, link);
    const how = label(node);
    if (how) li.append(" ", grove.el("span", { cls: "lineage-kind", text: how }));
    if (node.live) li.append(" ", grove.badge("live"));
    else if (node.result) li.append(" ", grove.badge(node.result));
    const children = kids.get(node.id) || [];
    if (children.length) li.append(grove.el("ul", null, ...children.map((child) => item(child, kids))));
    return li;
  }

  grove.getJSON(grove.path("/ui/api/trajectories", id, "lineage"))
    .then((tree) => {
      if (!tree.nodes || tree.nodes.length < 2) return;
      const kids = new Map();
      for (const node of tree.nodes.slice(1)) {
        if (!kids.has(node.parent)) kids.set(node.parent, []);
        kids.get(node.parent).push(node);
      }
      const root = tree.nodes[0];
      section.append(grove.el("h2", { text: "Lineage" }), grove.el("ul", { cls: "lineage-tree" }, item(root, kids)));
      if (tree.truncated) section.append(grove.el("p", { cls: "muted", text: "More branches than shown." }));
      section.hidden = false;
    })
    .catch((e) => grove.showError("could not load the lineage tree: " + e.message));
})();
