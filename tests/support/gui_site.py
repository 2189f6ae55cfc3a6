"""A small web site for computer-use tests, served inside a sandbox by Python's own http.server.

Every page reports to its server (``POST /state``, appended to ``state.jsonl`` in the sandbox): its layout
once loaded (each ``[data-t]`` element's box in screen pixels, from the window's position and its
toolbar's height), and each thing the user did (a click, a submitted form, a slider's value, how far it
scrolled). A test reads what the site saw with :func:`site_state`, and where to click with :func:`box`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

from grove.client import Sandbox
from tests.support.router_fixtures import RouterProcess

PORT = 8000
ROOT = "/workspace/site"
URL = f"http://127.0.0.1:{PORT}/"

SERVER = """
import http.server, json, os
STATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "state.jsonl")
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with open(STATE, "ab") as fh:
            fh.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(204)
        self.end_headers()
    def log_message(self, *args):
        pass
os.chdir(os.path.dirname(os.path.abspath(__file__)))
http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
""".replace("PORT", str(PORT))

SCRIPT = """
function report(what) {
  navigator.sendBeacon('/state', JSON.stringify(what));
}
function layout() {
  const top = window.screenY + (window.outerHeight - window.innerHeight);
  const left = window.screenX + (window.outerWidth - window.innerWidth) / 2;
  const boxes = {};
  for (const el of document.querySelectorAll('[data-t]')) {
    const r = el.getBoundingClientRect();
    boxes[el.dataset.t] = [Math.round(left + r.left), Math.round(top + r.top), Math.round(r.width),
                           Math.round(r.height)];
  }
  report({event: 'layout', page: location.pathname, boxes: boxes});
}
window.addEventListener('load', () => setTimeout(layout, 50));
"""

INDEX = """<!doctype html><html><head><meta charset="utf-8"><title>grove test site</title>
<style>body{margin:0;font:16px sans-serif} #go{position:absolute;left:100px;top:60px;width:220px;height:70px;
font-size:22px} #name{position:absolute;left:100px;top:180px;width:300px;height:30px;font-size:18px}
#level{position:absolute;left:100px;top:260px;width:400px} #far{position:absolute;left:100px;top:3000px}
#status{position:absolute;left:500px;top:60px;font-size:22px}</style></head><body>
<button id="go" data-t="go" onclick="document.body.style.background='rgb(0, 160, 0)';
  document.getElementById('status').textContent='clicked'; report({event: 'click', id: 'go'})">Go</button>
<span id="status" data-t="status">waiting</span>
<form id="form"
  onsubmit="event.preventDefault(); report({event: 'submit', name: document.getElementById('name').value})">
<input id="name" data-t="name" autocomplete="off"></form>
<input id="level" data-t="level" type="range" min="0" max="100" value="0"
  onchange="report({event: 'slider', value: Number(this.value)})">
<div id="far" data-t="far">the bottom of the page</div>
<script>SCRIPT
window.addEventListener('scroll', () => report({event: 'scroll', y: Math.round(window.scrollY)}));
</script></body></html>
""".replace("SCRIPT", SCRIPT)


def serve(sandbox: Sandbox, pages: dict[str, str] | None = None) -> None:
    """Write the site into the sandbox and start its server in the background; wait until it answers."""
    for name, text in {"server.py": SERVER, "index.html": INDEX, **(pages or {})}.items():
        sandbox.write_file(f"{ROOT}/{name}", text)
    sandbox.exec(f"rm -f {ROOT}/state.jsonl; cd {ROOT} && (nohup python3 server.py >/dev/null 2>&1 &)")
    up = sandbox.exec(f"for i in $(seq 100); do python3 -c \"import urllib.request as u; u.urlopen('{URL}')\" "
                      "2>/dev/null && exit 0; sleep 0.1; done; exit 1")
    assert up.exit_code == 0, "the test site did not come up"


@contextlib.contextmanager
def site_sandbox(router: RouterProcess, pages: dict[str, str] | None = None,
                 **options: Any) -> Iterator[Sandbox]:
    """A sandbox (2 GiB: Chromium) with the site served, deleted at the end."""
    with router.client() as client:
        sandbox = client.create(heartbeat=False, memory_mb=2048, **options)
        try:
            serve(sandbox, pages)
            yield sandbox
        finally:
            sandbox.close()


def fresh_page(sandbox: Sandbox, url: str = URL) -> Sandbox:
    """The site's page freshly loaded (its state file emptied first), its layout reported."""
    sandbox.exec(f"rm -f {ROOT}/state.jsonl")
    sandbox.computer.start(browser=url)
    wait_state(sandbox, "layout")
    return sandbox


def site_state(sandbox: Sandbox) -> list[dict[str, Any]]:
    """What the site recorded, in order."""
    raw = sandbox.exec(f"cat {ROOT}/state.jsonl 2>/dev/null || true").stdout.decode()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def wait_state(sandbox: Sandbox, event: str, timeout: float = 10.0) -> dict[str, Any]:
    """The last entry of kind ``event`` the site recorded, waiting for one."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in site_state(sandbox) if e.get("event") == event]
        if found:
            return found[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"the site recorded no {event!r} in {timeout}s: {site_state(sandbox)[-5:]}")
        time.sleep(0.1)


def box(sandbox: Sandbox, name: str, page: str = "/") -> tuple[int, int, int, int]:
    """An element's box on the screen, ``(x, y, width, height)``, from the page's last layout report."""
    layouts = [e for e in site_state(sandbox) if e.get("event") == "layout" and e.get("page") == page]
    assert layouts, f"page {page} reported no layout: {site_state(sandbox)[-5:]}"
    x, y, w, h = layouts[-1]["boxes"][name]
    return int(x), int(y), int(w), int(h)


def centre(sandbox: Sandbox, name: str) -> tuple[int, int]:
    """The middle of an element on the screen."""
    x, y, w, h = box(sandbox, name)
    return x + w // 2, y + h // 2
