// grove viewer: one sandbox — its configuration, its screen while it has one, its trajectory following new
// steps, and deleting it.
"use strict";

(() => {
  const { getJSON, path, post } = grove;
  const id = document.getElementById("sandbox-id").dataset.id;
  const status = document.getElementById("status");
  const button = document.getElementById("delete");
  let ended = false;

  async function refresh() {
    try {
      const got = await getJSON(path("/ui/api/sandboxes", id));
      timeline.sandboxMeta(document.getElementById("config"), got.sandbox);
      status.textContent = got.sandbox.status;
      status.className = "badge " + got.sandbox.status;
      ended = got.sandbox.status === "deleted";
    } catch (e) {
      grove.showError(e.message);
      ended = true;
    }
    button.disabled = ended;
    if (!ended) setTimeout(refresh, 2000);
  }

  // Two clicks, no modal dialog: the first arms the button, the second deletes.
  button.addEventListener("click", async () => {
    if (button.dataset.armed !== "1") {
      button.dataset.armed = "1";
      button.textContent = "Click again to delete";
      return;
    }
    button.disabled = true;
    try {
      await post(path("/ui/api/sandboxes", id, "delete"));
      button.textContent = "Deleted";
      status.textContent = "deleted";
    } catch (e) {
      grove.showError("delete failed: " + e.message);
      button.disabled = false;
    }
  });

  const live = document.getElementById("live");
  live.textContent = "following live";
  timeline.mount(document.getElementById("timeline"), id, {
    follow: true,
    onEnd: () => { live.textContent = "ended"; },
  });
  liveScreen.mount(document.getElementById("screen"), id, () => ended);
  refresh();
})();
