// grove viewer: the rollout runs stored in S3.
"use strict";

(async () => {
  const { el, path, getJSON } = grove;
  try {
    const got = await getJSON("/ui/api/runs");
    const list = document.getElementById("runs");
    for (const id of got.runs) list.append(el("li", {}, el("a", { href: path("/ui/runs", id), cls: "mono", text: id })));
    document.getElementById("empty").hidden = got.runs.length > 0;
  } catch (e) {
    grove.showError(e.message);
  }
})();
