// grove viewer: shared helpers. Every value that came from a sandbox or a harness is untrusted: it is only
// ever set as text (textContent, or a text node); no innerHTML anywhere, and no URL is built from it but
// by encodeURIComponent under a fixed /ui/ path.
"use strict";

const grove = (() => {
  function csrf() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  // el("div", {cls: "a b", text: "...", href: "/ui/...", title: "...", data: {k: v}}, child, "text", ...)
  function el(tag, opts, ...children) {
    const node = document.createElement(tag);
    const o = opts || {};
    if (o.cls) node.className = o.cls;
    if (o.text !== undefined && o.text !== null) node.textContent = String(o.text);
    if (o.href) node.setAttribute("href", safeHref(o.href));
    if (o.title) node.setAttribute("title", String(o.title));
    if (o.id) node.id = o.id;
    if (o.type) node.setAttribute("type", o.type);
    if (o.data) for (const [k, v] of Object.entries(o.data)) node.dataset[k] = String(v);
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  // Only the viewer's own paths are ever linked (a record cannot smuggle in a javascript: URL).
  function safeHref(href) {
    const text = String(href);
    return text.startsWith("/ui/") ? text : "/ui/";
  }

  function path(...parts) {
    return parts.map((p, i) => (i === 0 ? p : encodeURIComponent(String(p)))).join("/");
  }

  async function getJSON(url) {
    const resp = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (resp.status === 401) {
      window.location.assign("/ui/login?next=" + encodeURIComponent(window.location.pathname + window.location.search));
      throw new Error("the session ended; log in again");
    }
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) {
      const message = body && body.error && body.error.message ? body.error.message : resp.status + " " + resp.statusText;
      throw new Error(message);
    }
    return body;
  }

  async function post(url) {
    const resp = await fetch(url, {
      method: "POST", credentials: "same-origin",
      headers: { Accept: "application/json", "X-CSRF-Token": csrf() },
    });
    let body = null;
    try { body = await resp.json(); } catch (e) { body = null; }
    if (!resp.ok) throw new Error(body && body.error ? body.error.message : String(resp.status));
    return body;
  }

  function showError(message) {
    const box = document.getElementById("error");
    if (!box) return;
    box.textContent = message ? String(message) : "";
    box.hidden = !message;
  }

  function ago(seconds) {
    if (seconds === null || seconds === undefined || isNaN(seconds)) return "—";
    const s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d " + Math.floor((s % 86400) / 3600) + "h";
  }

  function when(epoch) {
    if (typeof epoch !== "number") return epoch ? String(epoch) : "—";
    return new Date(epoch * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function bytes(n) {
    if (typeof n !== "number") return "—";
    if (n < 1024) return n + " B";
    const units = ["kB", "MB", "GB", "TB"];
    let v = n / 1024, u = 0;
    while (v >= 1024 && u < units.length - 1) { v /= 1024; u++; }
    return v.toFixed(v < 10 ? 1 : 0) + " " + units[u];
  }

  function seconds(s) {
    if (typeof s !== "number") return "—";
    return s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(s < 10 ? 2 : 1) + " s";
  }

  function show(value) {
    if (value === null || value === undefined || value === "") return "—";
    if (typeof value === "object") return JSON.stringify(value);
    return String(value);
  }

  function kv(container, label, value, opts) {
    const box = el("div", { cls: "kv" }, el("div", { cls: "k", text: label }),
      value instanceof Node ? el("div", { cls: "v" }, value) : el("div", { cls: "v" + (opts && opts.mono ? " mono" : ""), text: show(value) }));
    container.append(box);
    return box;
  }

  function badge(text, cls) {
    return el("span", { cls: "badge " + (cls || String(text)), text: show(text) });
  }

  // ANSI SGR colours as spans with classes; every other escape sequence is dropped. Text stays text.
  const ESCAPES = /\x1b(?:\[([0-9;?]*)([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])/g;

  function ansi(text) {
    const frag = document.createDocumentFragment();
    const st = { bold: false, dim: false, italic: false, underline: false, fg: null, bg: null };
    let last = 0;
    const emit = (chunk) => {
      if (!chunk) return;
      const classes = [];
      if (st.bold) classes.push("ansi-bold");
      if (st.dim) classes.push("ansi-dim");
      if (st.italic) classes.push("ansi-italic");
      if (st.underline) classes.push("ansi-underline");
      if (st.fg !== null) classes.push("ansi-fg-" + st.fg);
      if (st.bg !== null) classes.push("ansi-bg-" + st.bg);
      if (classes.length) frag.append(el("span", { cls: classes.join(" "), text: chunk }));
      else frag.append(document.createTextNode(chunk));
    };
    for (const m of String(text).matchAll(ESCAPES)) {
      emit(text.slice(last, m.index));
      last = m.index + m[0].length;
      if (m[2] === "m") sgr(st, (m[1] || "0").split(";").map((c) => parseInt(c || "0", 10)));
    }
    emit(String(text).slice(last));
    return frag;
  }

  function sgr(st, codes) {
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      if (c === 0) Object.assign(st, { bold: false, dim: false, italic: false, underline: false, fg: null, bg: null });
      else if (c === 1) st.bold = true;
      else if (c === 2) st.dim = true;
      else if (c === 3) st.italic = true;
      else if (c === 4) st.underline = true;
      else if (c === 22) { st.bold = false; st.dim = false; }
      else if (c === 23) st.italic = false;
      else if (c === 24) st.underline = false;
      else if (c >= 30 && c <= 37) st.fg = c - 30;
      else if (c === 39) st.fg = null;
      else if (c >= 40 && c <= 47) st.bg = c - 40;
      else if (c === 49) st.bg = null;
      else if (c >= 90 && c <= 97) st.fg = c - 90 + 8;
      else if (c >= 100 && c <= 107) st.bg = c - 100;
      else if (c === 38 || c === 48) {
        // 38;5;n (256 colours: the first 16 map to classes) or 38;2;r;g;b (true colour: ignored).
        if (codes[i + 1] === 5) {
          const n = codes[i + 2];
          if (c === 38 && n < 16) st.fg = n;
          if (c === 48 && n < 8) st.bg = n;
          i += 2;
        } else if (codes[i + 1] === 2) i += 4;
      }
    }
  }

  return { csrf, el, path, getJSON, post, showError, ago, when, bytes, seconds, show, kv, badge, ansi };
})();
