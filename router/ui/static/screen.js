// grove viewer: a live sandbox's screen, polled while the page is visible (every second while a screen runs,
// every few seconds while it has none or sleeps). The viewer only looks: the router starts no display, wakes
// no sandbox and records no step for it. The image comes as a data: URL (the CSP allows no blob: images) and
// is redrawn only when its hash changed.
"use strict";

const liveScreen = (() => {
  const { el, path } = grove;
  const EVERY_MS = 1000;
  const WAITING_MS = 3000;

  function dataURL(blob) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result));
      reader.onerror = () => reject(reader.error);
      reader.readAsDataURL(blob);
    });
  }

  // Poll sandbox `id`'s screen into `section` until `ended()` says the sandbox is gone.
  function mount(section, id, ended) {
    let img = null, state = null, sha = null, timer = null, running = false, stopped = false;

    function build() {
      img = el("img", { id: "live-screen" });
      img.setAttribute("alt", "the sandbox's screen now");
      state = el("span", { cls: "live", id: "screen-state" });
      section.append(el("h2", {}, "Screen ", state), el("div", { cls: "live-stage" }, img));
      section.hidden = false;
    }

    async function look() {
      const resp = await fetch(path("/ui/api/sandboxes", id, "screen"), { credentials: "same-origin" });
      if (resp.ok) {
        const got = resp.headers.get("X-Grove-Screen-Sha256") || "";
        if (!img) build();
        if (got !== sha || !sha) {
          const url = await dataURL(await resp.blob());
          img.setAttribute("src", url);
          img.dataset.sha = got;
          sha = got;
        }
        section.classList.remove("stale");
        state.textContent = "live · " + new Date().toISOString().slice(11, 19) + " UTC";
        return EVERY_MS;
      }
      let body = null;
      try { body = await resp.json(); } catch (e) { body = null; }
      const message = body && body.error && body.error.message ? body.error.message : resp.status + " " + resp.statusText;
      if (img) { // a screen shown before: keep its last image, say why it stopped
        section.classList.add("stale");
        state.textContent = message;
      }
      // 409: no screen yet, or asleep — it may come back. Anything else (gone, logged out): stop.
      return resp.status === 409 ? WAITING_MS : null;
    }

    // One loop at a time: a tick runs, or one waits in `timer`, or (hidden, or stopped) neither.
    async function tick() {
      timer = null;
      if (stopped || ended() || document.visibilityState !== "visible") return; // visibilitychange resumes it
      running = true;
      let next = WAITING_MS;
      try { next = await look(); } catch (e) { next = WAITING_MS; }
      running = false;
      if (next === null) stopped = true;
      else if (!ended()) timer = setTimeout(tick, next);
    }

    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible" && timer === null && !running) tick();
    });
    tick();
  }

  return { mount };
})();
