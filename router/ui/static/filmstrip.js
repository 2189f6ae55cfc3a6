// grove viewer: a GUI trajectory's filmstrip — each computer step's screen as a thumbnail; the one selected
// shown whole with its click point or drag path drawn over it (SVG, in the screenshot's own pixels) and what
// was typed, pressed or scrolled under it. Every field came from the sandbox: numbers are checked as numbers,
// text is set as text, and an image is asked for only by a hash of 64 hex digits under /ui/api/.
"use strict";

const filmstrip = (() => {
  const { el, path, getJSON, show } = grove;
  const SVG = "http://www.w3.org/2000/svg";
  const SHA = /^[0-9a-f]{64}$/;
  const PAGE = 500;
  let current = null; // the page's filmstrip, for a timeline row to select its step in

  const finite = (v) => typeof v === "number" && Number.isFinite(v);
  const argsOf = (step) => (step.args && typeof step.args === "object" && !Array.isArray(step.args) ? step.args : {});

  // [x, y] or {x, y} as [x, y]; anything else null.
  function point(v) {
    if (Array.isArray(v) && v.length === 2 && finite(v[0]) && finite(v[1])) return [v[0], v[1]];
    if (v && typeof v === "object" && finite(v.x) && finite(v.y)) return [v.x, v.y];
    return null;
  }

  // What to draw: a drag's path (Anthropic's start_coordinate → coordinate, OpenAI's path) or one point.
  function geometry(step) {
    const a = argsOf(step);
    const action = String(step.action || "");
    if (action === "zoom") return {}; // its screenshot is the enlarged region, not the screen
    const trail = Array.isArray(a.path) ? a.path.map(point).filter((p) => p) : [];
    if (trail.length >= 2) return { path: trail };
    const start = point(a.start_coordinate), end = point(a.coordinate);
    if (start && end) return { path: [start, end] };
    const at = end || point(a);
    if (at) return { point: at };
    // A click without a coordinate clicks where the pointer is: the cursor after it.
    if (/click|mouse_down|mouse_up/.test(action) && !step.error && point(step.cursor)) return { point: point(step.cursor) };
    return {};
  }

  const xy = (p) => "(" + p[0] + ", " + p[1] + ")";

  // The caption: the action, where, and what was typed, pressed or scrolled — each a text node.
  function caption(step) {
    const a = argsOf(step);
    const action = String(step.action || "?");
    const box = el("div", { cls: "caption" }, el("span", { cls: "action", text: action }));
    const part = (cls, label, value) => box.append(el("span", { cls: "part " + cls }, label ? el("span", { cls: "label", text: label }) : null,
      value === undefined ? null : el("span", { cls: "value", text: value })));
    const g = geometry(step);
    if (g.path) part("where", "", "from " + xy(g.path[0]) + " to " + xy(g.path[g.path.length - 1]) + (g.path.length > 2 ? " through " + (g.path.length - 2) + " more points" : ""));
    else if (g.point) part("where", "", "at " + xy(g.point));
    if (typeof a.text === "string" && a.text) {
      if (action === "type") part("typed", "typed", a.text);
      else if (action === "key" || action === "hold_key") part("keys", "keys", a.text);
      else part("keys", "holding", a.text);
    }
    if (Array.isArray(a.keys)) part("keys", "keys", a.keys.map((k) => show(k)).join("+"));
    if (a.scroll_direction !== undefined || a.scroll_amount !== undefined) part("scroll", "scroll", show(a.scroll_direction) + " × " + show(a.scroll_amount));
    if (a.scroll_x !== undefined || a.scroll_y !== undefined) part("scroll", "scroll", "x " + show(a.scroll_x) + ", y " + show(a.scroll_y));
    if (a.button !== undefined && a.button !== "left") part("button", "button", show(a.button));
    if (a.duration !== undefined) part("duration", "for", show(a.duration) + " s");
    if (Array.isArray(a.region)) part("region", "region", a.region.map((v) => show(v)).join(", "));
    const err = step.error && typeof step.error === "object" ? step.error : null;
    if (err) part("bad", "failed", show(step.status) + " " + show(err.code) + ": " + show(err.message));
    const shot = step.screenshot && typeof step.screenshot === "object" ? step.screenshot : null;
    if (shot && shot.stored === false) part("muted", "screenshot not stored", show(shot.reason));
    if (step.clipped) part("muted", "", "(cut short: “show the whole step” in the timeline has all of it)");
    return box;
  }

  // The step's stored screenshot (or its thumbnail), or null if it has none to show.
  function imageURL(sid, step, thumb) {
    const shot = step.screenshot && typeof step.screenshot === "object" ? step.screenshot : null;
    if (!shot || shot.stored === false || typeof shot.sha256 !== "string" || !SHA.test(shot.sha256)) return null;
    return path("/ui/api/trajectories", sid, "screenshots", shot.sha256) + (thumb ? "?thumb=1" : "");
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    return node;
  }

  // The marks over a screenshot of width × height pixels.
  function overlay(step, width, height) {
    const layer = svg("svg", { id: "frame-overlay", class: "overlay", viewBox: "0 0 " + width + " " + height, preserveAspectRatio: "none" });
    const r = Math.max(6, Math.round(Math.max(width, height) / 64));
    const g = geometry(step);
    if (g.path) {
      layer.append(svg("polyline", { id: "frame-path", class: "mark drag", points: g.path.map((p) => p[0] + "," + p[1]).join(" ") }));
      const [x0, y0] = g.path[0];
      layer.append(svg("circle", { id: "frame-start", class: "mark start", cx: x0, cy: y0, r: r / 2 }));
    }
    const at = g.point || (g.path ? g.path[g.path.length - 1] : null);
    if (at) {
      layer.append(svg("circle", { id: "frame-marker", class: "mark point", cx: at[0], cy: at[1], r: r }));
      layer.append(svg("circle", { class: "mark dot", cx: at[0], cy: at[1], r: Math.max(2, r / 5) }));
    }
    return layer;
  }

  // One step whole: its screen with the marks, its caption.
  function frameView(sid, step) {
    const shot = step.screenshot && typeof step.screenshot === "object" ? step.screenshot : {};
    const head = el("div", { cls: "frame-head" }, el("span", { cls: "idx", text: "#" + step.i }),
      el("span", { cls: "muted", text: typeof step.t === "number" ? grove.when(step.t).slice(11) : "" }),
      finite(step.duration_ms) ? el("span", { cls: "muted", text: step.duration_ms + " ms" }) : null);
    const view = el("figure", { cls: "frame-view", id: "frame-view", data: { i: step.i } }, head);
    const url = imageURL(sid, step, false);
    if (url) {
      const img = el("img", { id: "frame-image" });
      img.setAttribute("alt", "screen after step #" + step.i);
      const w = finite(shot.width) && shot.width > 0 ? shot.width : 1280, h = finite(shot.height) && shot.height > 0 ? shot.height : 800;
      const stage = el("div", { cls: "stage" }, img, overlay(step, w, h));
      // The image's own size decides (the recorded one is the sandbox's word).
      img.addEventListener("load", () => {
        if (img.naturalWidth && (img.naturalWidth !== w || img.naturalHeight !== h)) {
          stage.querySelector("svg").replaceWith(overlay(step, img.naturalWidth, img.naturalHeight));
        }
        stage.classList.add("loaded");
      });
      img.setAttribute("src", url);
      view.append(stage);
    } else {
      view.append(el("div", { cls: "no-screen", text: step.error ? "no screen: the action failed" : "no screenshot stored" }));
    }
    view.append(el("figcaption", { id: "frame-caption" }, caption(step)));
    return view;
  }

  function thumb(sid, step) {
    const url = imageURL(sid, step, true);
    const button = el("button", { cls: "frame" + (step.error ? " failed" : ""), type: "button", title: "step #" + step.i + " " + show(step.action), data: { i: step.i } });
    if (url) {
      const img = el("img", { cls: "thumb" });
      img.setAttribute("alt", "step #" + step.i);
      img.setAttribute("loading", "lazy");
      img.setAttribute("src", url);
      button.append(img);
    } else {
      button.append(el("span", { cls: "thumb none", text: step.error ? "failed" : "—" }));
    }
    button.append(el("span", { cls: "label", text: "#" + step.i + " " + show(step.action) }));
    return button;
  }

  // The trajectory page's filmstrip in `section` (built once the record has a computer step).
  function mount(section, sid) {
    const frames = new Map();
    let strip = null, holder = null, selected = null, live = false, offset = 0;

    function select(i) {
      const step = frames.get(i);
      if (!step || !strip) return false;
      for (const b of strip.querySelectorAll("button.frame.selected")) b.classList.remove("selected");
      const button = strip.querySelector('button.frame[data-i="' + i + '"]');
      if (button) { button.classList.add("selected"); button.scrollIntoView({ block: "nearest", inline: "nearest" }); }
      selected = i;
      holder.replaceChildren(frameView(sid, step));
      return true;
    }

    function build() {
      strip = el("div", { cls: "strip", id: "strip" });
      holder = el("div", { cls: "frame-holder" });
      section.append(el("h2", {}, "Screens ", el("span", { cls: "count", id: "frame-count" })), strip, holder);
      section.hidden = false;
      strip.addEventListener("click", (e) => {
        const button = e.target.closest("button.frame");
        if (button) select(Number(button.dataset.i));
      });
      strip.addEventListener("keydown", (e) => {
        if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
        const order = [...frames.keys()];
        const next = order[order.indexOf(selected) + (e.key === "ArrowRight" ? 1 : -1)];
        if (next !== undefined) { e.preventDefault(); select(next); strip.querySelector('button.frame[data-i="' + next + '"]').focus(); }
      });
    }

    async function load() {
      let body;
      do {
        body = await getJSON(path("/ui/api/trajectories", sid, "filmstrip") + "?offset=" + offset + "&limit=" + PAGE);
        live = body.live;
        offset += body.frames.length;
        if (body.frames.length && !strip) build();
        for (const step of body.frames) {
          if (!Number.isInteger(step.i) || frames.has(step.i)) continue;
          frames.set(step.i, step);
          strip.append(thumb(sid, step));
        }
        if (strip) section.querySelector("#frame-count").textContent = frames.size + " computer steps";
        if (strip && selected === null && frames.size) select(frames.keys().next().value);
      } while (body.frames.length && offset < body.total);
    }

    async function poll() {
      try { await load(); } catch (e) { grove.showError("could not load the screens: " + e.message); }
      if (live) setTimeout(poll, 2000);
    }

    current = { select };
    poll();
    return current;
  }

  // A computer action as a timeline row: what it did beside its screen's thumbnail, which selects it in the
  // page's filmstrip.
  function row(sid, step, node) {
    const box = el("div", { cls: "computer-row" }, caption(step));
    const url = imageURL(sid, step, true);
    if (url) {
      const img = el("img", { cls: "row-thumb" });
      img.setAttribute("alt", "screen after step #" + step.i);
      img.setAttribute("loading", "lazy");
      img.setAttribute("src", url);
      img.addEventListener("click", () => {
        if (select(step.i)) document.getElementById("filmstrip").scrollIntoView({ block: "start" });
      });
      box.prepend(img);
    }
    node.append(box);
    if (step.error) node.classList.add("failed");
  }

  // A display start as a timeline row: the screen, and the browser's URL as text.
  function displayRow(step, node) {
    const d = step.display && typeof step.display === "object" ? step.display : {};
    node.append(el("div", { cls: "facts" }, el("span", { text: "screen " + show(d.display) + " " + show(d.width) + "×" + show(d.height) }),
      step.browser ? el("span", { cls: "mono", text: "browser " + show(step.browser) }) : null));
  }

  // Select step i in the page's filmstrip (from a timeline row); false if there is none.
  function select(i) {
    return current ? current.select(i) : false;
  }

  return { caption, geometry, imageURL, thumb, mount, select, row, displayRow };
})();
