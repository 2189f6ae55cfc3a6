"""A sandbox's screen: Xvfb, a window manager and a browser, started on demand, driven with xdotool.

Everything runs inside the sandbox, as its other processes do: no host X server, no GPU, the sandbox's
network policy. The display is ``:99``; once it runs, commands the sandbox execs see ``DISPLAY=:99``.

**Settling.** After an input action the answer waits for the screen to settle: unchanged for
``quiet_ms`` (default 250), checked every 30 ms, for at most ``cap_ms`` (default 3,000). The answer says
which (``settle.settled``) and how long it waited. A screenshot, a zoom or a cursor query waits for nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from executor import reaper
from executor.computer import png
from executor.computer.actions import Plan, plan
from executor.computer.framebuffer import Frame, Framebuffer
from executor.settings import DesktopSettings
from grove.core.errors import Conflict, Invalid, NoDisplay, Unavailable

DISPLAY = ":99"
_SOCKET = "/tmp/.X11-unix/X99"
_POLL_S = 0.03
_START_S = 15.0
_BROWSER_S = 60.0
_XDOTOOL_S = 90.0
_CDP = "http://127.0.0.1:9222"
_CURRENT: Desktop | None = None
"""The sandbox's display (see :func:`desktop_for`): one per executor process, as there is one screen :99."""
_BROWSERS = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
"""Debian's binary first: its /usr/bin/chromium wrapper reads /etc/chromium.d, which a sandbox may not have."""
BROWSER_FLAGS = (
    # Chromium's own sandbox needs user namespaces inside the sandbox, which grove's seccomp refuses; the
    # sandbox around it is grove's (SECURITY.md, "Browsers"). --test-type keeps the bar warning of it off the
    # screen (an agent would read it, and it shifts the page down).
    "--no-sandbox", "--test-type", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-breakpad",
    "--disable-features=Translate,MediaRouter,OptimizationHints", "--password-store=basic",
    "--noerrdialogs", "--hide-crash-restore-bubble", "--disable-session-crashed-bubble",
    "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=9222", "--remote-allow-origins=http://127.0.0.1",
    "--user-data-dir=/tmp/grove-browser", "--window-position=0,0",
)


@dataclass(frozen=True)
class Shot:
    """One screenshot as the model sees it."""

    png: bytes
    width: int
    height: int
    thumb: bytes
    thumb_width: int
    thumb_height: int


def desktop_for(settings: DesktopSettings, env: Mapping[str, str], shared_env: dict[str, str]) -> Desktop:
    """The sandbox's display, for an app being built. The display belongs to the sandbox, not to one app:
    a warm pool's member is claimed by building a new app (:mod:`executor.claim`), and its screen and
    browser, up since before the claim, must be that app's too."""
    global _CURRENT
    current = _CURRENT
    if current is not None and current.settings == settings:
        current.rebind(env, shared_env)
        return current
    if current is not None:
        current.close()
    _CURRENT = Desktop(settings, env, shared_env)
    return _CURRENT


class Desktop:
    """The display of one sandbox (one per executor); one action at a time."""

    def __init__(self, settings: DesktopSettings, env: Mapping[str, str], shared_env: dict[str, str]) -> None:
        self.settings = settings
        self._env = dict(env)
        self._shared_env = shared_env
        """The runner's extra environment: ``DISPLAY`` is added once the display runs."""
        self._lock = threading.Lock()
        self._xvfb: subprocess.Popen[bytes] | None = None
        self._browser: subprocess.Popen[bytes] | None = None
        self._fb: Framebuffer | None = None
        self._last: tuple[bytes, Shot] | None = None

    # -- the API ---------------------------------------------------------------------------------------

    def rebind(self, env: Mapping[str, str], shared_env: dict[str, str]) -> None:
        """Serve a new app: its environment for what the display starts from now on, its runner told of
        ``DISPLAY`` if the display runs."""
        with self._lock:
            self._env = dict(env)
            self._shared_env = shared_env
            if self._running():
                self._env["DISPLAY"] = shared_env["DISPLAY"] = DISPLAY

    def act(self, body: Any) -> dict[str, Any]:
        """Do one computer action and answer with the screen after it (see the module's docstring)."""
        settings = self.settings
        action = plan(body, settings.width, settings.height)
        quiet_ms, cap_ms = _settle_args(body.get("settle"), settings)
        with self._lock:
            fresh = not self._running()
            fb = self._ensure()
            if fresh and settings.browser:  # a desktop made with a browser gets it back after a restart too
                self._open(settings.browser, fb)
            began = time.monotonic()
            for command in action.commands:
                self._xdotool(command)
            if action.pause_s:
                time.sleep(action.pause_s)
            frame, settled = self._settle(fb, quiet_ms, cap_ms) if action.settle else (fb.read(), None)
            waited_ms = round((time.monotonic() - began) * 1000)
            where = self._spawn(["getmouselocation", "--shell"])  # asked while the frame is encoded
            shot = self._zoom(frame, action) if action.region else self._shot(frame)
            cursor = _position(self._finish(where, ["getmouselocation"]))
        answer: dict[str, Any] = {
            "protocol": action.protocol, "schema": action.schema, "action": action.action, "args": action.args,
            "screenshot": shot, "cursor": cursor,
            "settle": {"settled": settled, "waited_ms": waited_ms, "quiet_ms": quiet_ms, "cap_ms": cap_ms},
        }
        if action.region:
            answer["region"] = list(action.region)
        return answer

    def start(self, browser: str | None = None) -> dict[str, Any]:
        """Start the display (and, with ``browser``, Chromium at that URL, or the running one sent there);
        answer once its screen has settled."""
        with self._lock:
            fb = self._ensure()
            url = browser or (self.settings.browser if self._browser is None else None)
            if url:
                self._open(url, fb)
            return self.status()

    def peek(self) -> Shot:
        """The screen now, if the display runs (409 if not): never starts one, records nothing (the viewer)."""
        with self._lock:
            if not self._running():
                raise Conflict("no screen running in this sandbox: it starts at the first computer action or "
                               "display request")
            assert self._fb is not None
            return self._shot(self._fb.read())

    def status(self) -> dict[str, Any]:
        """Whether the display and browser run, and the screen's size."""
        browser = self._browser is not None and self._browser.poll() is None
        return {"display": DISPLAY if self._running() else None, "width": self.settings.width,
                "height": self.settings.height, "browser": browser, "url": _current_url() if browser else None}

    # -- processes -------------------------------------------------------------------------------------

    def _running(self) -> bool:
        return self._xvfb is not None and self._xvfb.poll() is None and self._fb is not None

    def _ensure(self) -> Framebuffer:
        """The running display's framebuffer, starting Xvfb (and a window manager, if the image has one)."""
        if self._running():
            assert self._fb is not None
            return self._fb
        self._stop()
        xvfb = self._which("Xvfb")
        if xvfb is None:
            raise NoDisplay("this sandbox's image has no display: Xvfb is not installed in it. Use an image with "
                            "one (grove image build-debian NAME --preset desktop), or install xvfb, xdotool and a "
                            "browser in yours")
        if self._which("xdotool") is None:
            raise NoDisplay("this sandbox's image has Xvfb but no xdotool, which grove drives the screen with; "
                            "install xdotool (grove image build-debian NAME --preset desktop has it)")
        fbdir = "/dev/shm/grove-display" if os.path.isdir("/dev/shm") else "/tmp/grove-display"
        os.makedirs(fbdir, mode=0o700, exist_ok=True)
        os.makedirs("/tmp/.X11-unix", mode=0o1777, exist_ok=True)
        screen_file = os.path.join(fbdir, "Xvfb_screen0")
        for stale in (_SOCKET, "/tmp/.X99-lock", screen_file):
            if os.path.exists(stale):
                os.unlink(stale)  # left by a display that died with the sandbox's previous run
        s = self.settings
        log = open(os.path.join(fbdir, "xvfb.log"), "wb")  # noqa: SIM115 - the child keeps it
        with log:
            self._xvfb = _daemon([xvfb, DISPLAY, "-screen", "0", f"{s.width}x{s.height}x24", "-fbdir", fbdir,
                                  "-nolisten", "tcp", "-noreset", "-dpi", "96"], self._env, log)
        deadline = time.monotonic() + _START_S
        # Up once it listens and its screen file holds a whole header (the file appears before it is written).
        while (fb := _framebuffer(screen_file) if os.path.exists(_SOCKET) else None) is None:
            if self._xvfb.poll() is not None or time.monotonic() > deadline:
                tail = _tail(os.path.join(fbdir, "xvfb.log"))
                self._stop()
                raise Unavailable(f"the display did not start: Xvfb {'exited' if tail else 'did not answer'}"
                                  f"{': ' + tail if tail else ''}", retry_after=1)
            time.sleep(0.02)
        self._fb = fb
        self._shared_env["DISPLAY"] = DISPLAY
        self._env["DISPLAY"] = DISPLAY
        wm = self._which("matchbox-window-manager")
        if wm is not None:
            _daemon([wm, "-use_titlebar", "no", "-use_cursor", "yes"], self._env, subprocess.DEVNULL)
            # Its first paint (the pointer) over before anything compares screens: a browser starting next
            # is seen by the screen it changes, not by the window manager's.
            self._settle(self._fb, 200, 1500)
        self._last = None
        return self._fb

    def _open(self, url: str, fb: Framebuffer) -> None:
        """Chromium at ``url``: started if it does not run, else the URL opened in a new tab and the others
        closed (over its loopback debugging port, inside the sandbox)."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https", "file", "about", "data"):
            raise Invalid(f"'browser' must be an http(s), file, about or data URL, got {url!r}")
        before = fb.read().pixels
        quiet_ms = 600  # a page loading in a running browser
        if self._browser is not None and self._browser.poll() is None:
            self._navigate(url)
        else:
            quiet_ms = 1200  # a browser starting paints its window, its toolbar and then the page, with pauses
            binary = next((b for b in (self._which(n) for n in _BROWSERS) if b), None)
            if binary is None:
                raise NoDisplay("this sandbox's image has no browser: install chromium (grove image build-debian "
                                "NAME --preset desktop has it)")
            s = self.settings
            argv = [binary, *BROWSER_FLAGS, f"--window-size={s.width},{s.height}", url]
            self._browser = _daemon(argv, self._env, subprocess.DEVNULL)
        # Up once its debugging port answers and the screen has changed and then settled (its first paint, not
        # the display before it).
        deadline = time.monotonic() + _BROWSER_S
        while not _answers("/json/version") and time.monotonic() < deadline:
            if self._browser.poll() is not None:
                raise Unavailable("the browser exited as it started; run it by hand with exec to see why",
                                  retry_after=1)
            time.sleep(0.05)
        while fb.read().pixels == before and time.monotonic() < deadline:
            if self._browser.poll() is not None:
                raise Unavailable("the browser exited as it started; run it by hand with exec to see why",
                                  retry_after=1)
            time.sleep(0.05)
        self._settle(fb, quiet_ms, int(max(0.0, deadline - time.monotonic()) * 1000))

    def _navigate(self, url: str) -> None:
        tabs = _cdp("GET", "/json/list")
        _cdp("PUT", "/json/new?" + urllib.parse.quote(url, safe=":/?&=%#@!$'()*+,;~"))
        for tab in tabs if isinstance(tabs, list) else []:
            if isinstance(tab, dict) and tab.get("type") == "page" and isinstance(tab.get("id"), str):
                _cdp("GET", f"/json/close/{tab['id']}")

    def _stop(self) -> None:
        for proc in (self._browser, self._xvfb):
            if proc is not None and proc.poll() is None:
                proc.kill()
        self._browser = self._xvfb = None
        if self._fb is not None:
            self._fb.close()
            self._fb = None
        self._shared_env.pop("DISPLAY", None)

    def _which(self, name: str) -> str | None:
        if name.startswith("/"):
            return name if os.access(name, os.X_OK) else None
        return shutil.which(name, path=self._env.get("PATH"))

    # -- input and screen ------------------------------------------------------------------------------

    def _xdotool(self, command: list[str]) -> str:
        return self._finish(self._spawn(command), command)

    def _spawn(self, command: list[str]) -> subprocess.Popen[bytes]:
        # A UTF-8 locale, or xdotool types nothing past ASCII ("Invalid multi-byte sequence").
        env = {**self._env, "LC_ALL": "C.UTF-8"}
        return reaper.spawn(["xdotool", *command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, close_fds=True, start_new_session=True)

    def _finish(self, proc: subprocess.Popen[bytes], command: list[str]) -> str:
        try:
            out, err = proc.communicate(timeout=_XDOTOOL_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise Unavailable(f"xdotool {command[0]} did not finish in {_XDOTOOL_S:g}s", retry_after=1) from None
        finally:
            reaper.release(proc)
        if proc.returncode != 0:
            raise Invalid(f"xdotool {' '.join(command[:3])} failed: {err.decode(errors='replace').strip()[:300]}")
        return out.decode(errors="replace")

    def _settle(self, fb: Framebuffer, quiet_ms: int, cap_ms: int) -> tuple[Frame, bool]:
        """The screen once unchanged for ``quiet_ms``, or as it is after ``cap_ms``; and which."""
        began = time.monotonic()
        frame = fb.read()
        changed = began
        while True:
            now = time.monotonic()
            if (now - changed) * 1000 >= quiet_ms:
                return frame, True
            if (now - began) * 1000 >= cap_ms:
                return frame, False
            time.sleep(min(_POLL_S, max(0.001, quiet_ms / 1000 - (now - changed))))
            latest = fb.read()
            if latest.pixels != frame.pixels:
                frame, changed = latest, time.monotonic()

    def _shot(self, frame: Frame) -> Shot:
        """The frame as PNG and thumbnail; an unchanged screen reuses the last encoding."""
        if self._last is not None and self._last[0] == frame.pixels:
            return self._last[1]
        tw, th, thumb = png.frame_thumbnail(frame)
        shot = Shot(png.encode_frame(frame), frame.width, frame.height, thumb, tw, th)
        self._last = (frame.pixels, shot)
        return shot

    def _zoom(self, frame: Frame, action: Plan) -> Shot:
        """The region, enlarged by the largest whole factor that fits the screen (each pixel a sharp block)."""
        assert action.region is not None
        x0, y0, x1, y1 = action.region
        w, h = x1 - x0, y1 - y0
        region = png.crop(frame.width, png.rgb(frame), x0, y0, x1, y1)
        factor = max(1, min(frame.width // w, frame.height // h))
        zw, zh, zoomed = png.enlarge(w, h, region, factor)
        tw, th, thumb = png.thumbnail(zw, zh, zoomed)
        return Shot(png.encode(zw, zh, zoomed), zw, zh, thumb, tw, th)

    def close(self) -> None:
        """Stop the display and what runs on it."""
        with self._lock:
            self._stop()


def _position(answer: str) -> list[int]:
    """``getmouselocation --shell``'s ``X=..`` and ``Y=..`` lines."""
    found = dict(line.split("=", 1) for line in answer.split() if "=" in line)
    return [int(found.get("X", 0)), int(found.get("Y", 0))]


def _settle_args(value: Any, settings: DesktopSettings) -> tuple[int, int]:
    if value is None:
        return settings.quiet_ms, settings.cap_ms
    if not isinstance(value, dict) or set(value) - {"quiet_ms", "cap_ms"}:
        raise Invalid("'settle' must be an object with 'quiet_ms' and/or 'cap_ms'")
    quiet, cap = value.get("quiet_ms", settings.quiet_ms), value.get("cap_ms", settings.cap_ms)
    for name, v, top in (("quiet_ms", quiet, 10_000), ("cap_ms", cap, 60_000)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= top:
            raise Invalid(f"'settle.{name}' must be a whole number of milliseconds from 0 to {top:,}")
    return int(quiet), int(cap)


def _daemon(argv: list[str], env: Mapping[str, str], out: Any) -> subprocess.Popen[bytes]:
    """A long-lived child (the display, its window manager, the browser): in a session of its own, so a
    command's process-group kill never reaches it; left to the reaper once it exits."""
    proc = reaper.spawn(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=dict(env), close_fds=True,
                        start_new_session=True, cwd="/")
    reaper.release(proc)  # its exit is collected by the reaper (poll() then reads it as ended)
    return proc


def _cdp(method: str, path: str) -> Any:
    request = urllib.request.Request(_CDP + path, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            raw = reply.read()
    except OSError as exc:
        raise Unavailable(f"the browser's debugging port did not answer {path}: {exc}", retry_after=1) from exc
    try:
        return json.loads(raw or b"null")
    except ValueError:  # /json/close answers in words ("Target is closing")
        return raw.decode(errors="replace")


def _current_url() -> str | None:
    """The URL of the browser's first page (the one grove opened last: it closes the others), if it says."""
    try:
        tabs = _cdp("GET", "/json/list")
    except Unavailable:
        return None
    pages = [t for t in tabs if isinstance(t, dict) and t.get("type") == "page"] if isinstance(tabs, list) else []
    url = pages[0].get("url") if pages else None
    return url if isinstance(url, str) else None


def _framebuffer(path: str) -> Framebuffer | None:
    """The screen file mapped, or None while Xvfb has not written it yet (missing, empty, a zero header)."""
    try:
        return Framebuffer(path)
    except (OSError, ValueError):
        return None


def _answers(path: str) -> bool:
    """Whether the browser's debugging port answers ``path`` now."""
    try:
        with urllib.request.urlopen(_CDP + path, timeout=1):
            return True
    except OSError:
        return False


def _tail(path: str, limit: int = 600) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read()[-limit:].decode(errors="replace").strip()
    except OSError:
        return ""
