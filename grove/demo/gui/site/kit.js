// The kit's page script: reports where the page's elements are on the screen (for a scripted policy, which
// then acts through the computer API with those coordinates), and gives pages site.log(kind, body).
(function () {
  "use strict";
  var SEL = "a,button,input,select,textarea,label,h1,h2,h3,th,td,li,[id],[data-t]";
  var last = "", timer = null;
  var saved = null;
  try { saved = JSON.parse(localStorage.getItem("grove-offset") || "null"); } catch (e) { saved = null; }

  function offset() {
    // Where the viewport's (0, 0) is on the screen: measured from a mouse event once one came (screen minus
    // client coordinates), else estimated from the window's frame (the toolbar above the page).
    if (saved) return {x: saved[0], y: saved[1], measured: true};
    return {x: window.screenX + Math.round((window.outerWidth - window.innerWidth) / 2),
            y: window.screenY + window.outerHeight - window.innerHeight, measured: false};
  }

  function text(el) {
    var t = el.tagName === "INPUT" || el.tagName === "SELECT" || el.tagName === "TEXTAREA" ? "" : el.innerText;
    return (t || el.getAttribute("aria-label") || el.getAttribute("placeholder") || "").trim().slice(0, 120);
  }

  function layout() {
    var els = [], all = document.querySelectorAll(SEL);
    for (var i = 0; i < all.length && els.length < 400; i++) {
      var el = all[i], r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      var item = {tag: el.tagName.toLowerCase(), id: el.id || null, name: el.getAttribute("name"),
                  text: text(el), x: Math.round(r.left), y: Math.round(r.top), w: Math.round(r.width),
                  h: Math.round(r.height)};
      if ("value" in el && /^(INPUT|SELECT|TEXTAREA)$/.test(el.tagName)) item.value = String(el.value);
      if (el.type === "checkbox" || el.type === "radio") item.checked = el.checked;
      if (el.type === "range") { item.min = Number(el.min || 0); item.max = Number(el.max || 100); }
      if (el.tagName === "SELECT") {
        item.options = Array.prototype.map.call(el.options, function (o) { return o.text; });
        item.selected = el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : null;
      }
      els.push(item);
    }
    return {path: location.pathname + location.search, title: document.title, width: window.innerWidth,
            height: window.innerHeight, scroll: [window.scrollX, window.scrollY],
            page_height: document.documentElement.scrollHeight, offset: offset(),
            focus: document.activeElement && document.activeElement.id || null, elements: els};
  }

  function post(force) {
    var body = JSON.stringify(layout());
    if (!force && body === last) return;
    last = body;
    fetch("/__layout", {method: "POST", body: body, keepalive: true, headers: {"Content-Type": "application/json"}});
  }

  function soon() { clearTimeout(timer); timer = setTimeout(function () { post(true); }, 30); }

  ["scroll", "resize", "input", "change", "click", "keyup", "mouseup", "focusin"].forEach(function (name) {
    window.addEventListener(name, soon, true);
  });
  window.addEventListener("mousemove", function (e) {
    var now = [e.screenX - e.clientX, e.screenY - e.clientY];
    if (!saved || saved[0] !== now[0] || saved[1] !== now[1]) {
      saved = now;
      try { localStorage.setItem("grove-offset", JSON.stringify(now)); } catch (err) { /* private mode */ }
      soon();
    }
  }, true);
  window.addEventListener("pagehide", function () {
    clearTimeout(timer);
    fetch("/__layout", {method: "POST", body: JSON.stringify({leaving: location.pathname}), keepalive: true,
                        headers: {"Content-Type": "application/json"}});
  });
  new MutationObserver(soon).observe(document.documentElement, {subtree: true, childList: true, attributes: true,
                                                                characterData: true});
  if (document.readyState === "complete") post(true); else window.addEventListener("load", function () { post(true); });
  setInterval(function () { post(false); }, 400);

  window.site = {
    log: function (kind, body) {
      return fetch("/api/" + kind, {method: "POST", body: JSON.stringify(body || {}),
                                    headers: {"Content-Type": "application/json"}});
    },
  };
})();
