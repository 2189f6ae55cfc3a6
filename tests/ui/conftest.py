"""The viewer's tests drive a real browser: Debian's chromium through chromium-driver (selenium), against a
real router whose S3 holds records stored the way the router stores them.

One router and one browser per module. With ``GROVE_UI_SCREENSHOTS=<dir>`` set, the tests write a
screenshot of each page they visit there (``docs/ui`` holds the committed ones).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from artifacts.archive import TrajectoryArchive
from artifacts.s3config import S3Config
from artifacts.store import ObjectStore
from tests.support.executor_fixtures import Reply
from tests.support.router_fixtures import RouterProcess

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHROMIUM_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                 "--window-size=1400,1000")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """A headless Chromium with a fresh profile, for the module; quit (with its driver) at the end."""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        pytest.fail("chromium and chromium-driver are not installed: `make install` installs them "
                    "(apt-get install chromium chromium-driver)")
    os.environ["SE_OFFLINE"] = "true"  # selenium's manager must not look for drivers on the internet
    profile = tempfile.mkdtemp(prefix="grove-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console messages, CSP reports among them
    for arg in (*CHROMIUM_ARGS, f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def s3_config(router: RouterProcess) -> S3Config:
    """The router's embedded S3, read with its own credentials (as a data pipeline would)."""
    state = json.loads((router.state_dir / "s3" / "grove-s3.json").read_text())
    return S3Config(endpoint=f"http://127.0.0.1:{state['ports']['s3.port']}", access_key=state["access_key"],
                    secret_key=state["secret_key"])


@dataclass
class Viewer:
    """A logged-in (or not) browser on one router, with the helpers the tests share."""

    router: RouterProcess
    browser: WebDriver
    spool: Path

    def url(self, path: str) -> str:
        """An absolute URL of the router."""
        return self.router.url + path

    def open(self, path: str) -> None:
        """Load a page of the viewer."""
        self.browser.get(self.url(path))

    def login(self, key: str | None = None) -> None:
        """Log in through the form and land on the live sandboxes page (at once if already logged in)."""
        self.open("/ui/login")
        if not self.css("#key"):
            assert self.browser.current_url.endswith("/ui/"), self.browser.current_url
            return
        self.browser.find_element("id", "key").send_keys(key or self.router.key)
        self.browser.find_element("id", "login-button").click()
        self.wait(lambda: self.browser.current_url.endswith("/ui/"), what="the sandboxes page after login")

    def wait(self, predicate: Callable[[], Any], timeout: float = 15.0, what: str = "the page") -> Any:
        """Poll ``predicate`` until truthy (stale elements count as not yet)."""
        try:
            return WebDriverWait(self.browser, timeout, poll_frequency=0.05).until(lambda _: predicate())
        except TimeoutException:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; page text:\n"
                                 f"{self.browser.find_element('tag name', 'body').text[:3000]}") from None

    def css(self, selector: str) -> list[WebElement]:
        """Elements matching a CSS selector."""
        return self.browser.find_elements("css selector", selector)

    def text(self, selector: str = "main") -> str:
        """The rendered text of the first match."""
        return self.browser.find_element("css selector", selector).text

    def snap(self, name: str) -> None:
        """A screenshot of the page, when GROVE_UI_SCREENSHOTS names a directory."""
        where = os.environ.get("GROVE_UI_SCREENSHOTS")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            # The whole page (up to a limit), from its top: the window grows to the page plus its own frame.
            height, frame = self.browser.execute_script(
                "window.scrollTo(0, 0); return [Math.min(document.documentElement.scrollHeight, 2400),"
                " window.outerHeight - window.innerHeight]")
            self.browser.set_window_size(1400, max(600, int(height)) + int(frame))
            self.browser.execute_script("window.scrollTo(0, 0)")
            self.browser.save_screenshot(str(Path(where) / f"{name}.png"))
            self.browser.set_window_size(1400, 1000)

    def store(self, *records: dict[str, Any]) -> None:
        """Store records as the router does (trajectory object and index entries in its S3)."""
        with ObjectStore(s3_config(self.router)) as objects:
            archive = TrajectoryArchive(objects, self.spool)
            for record in records:
                assert not archive.store(record).spooled

    def put_object(self, key: str, data: bytes) -> None:
        """One object in the router's bucket (a truncated output's full text)."""
        with ObjectStore(s3_config(self.router)) as objects:
            objects.put_bytes(key, data)

    def session(self, key: str | None = None) -> str:
        """A session cookie value, logging in over plain HTTP."""
        found = self.try_session(key)
        assert found is not None, "the login was refused"
        return found

    def try_session(self, key: str | None = None) -> str | None:
        """A session cookie value, or None if the login form refuses the key."""
        body = urllib.parse.urlencode({"key": key or self.router.key, "next": "/ui/"}).encode()
        reply = self.router.http("POST", "/ui/login", body, auth=False,
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
        if reply.status == 401:
            return None
        assert reply.status == 303, reply.body
        cookie = SimpleCookie(reply.headers["Set-Cookie"])
        return cookie["grove_session"].value

    def get(self, path: str, session: str | None, **headers: str) -> Reply:
        """A GET with only the session cookie (no bearer key)."""
        if session is not None:
            headers["Cookie"] = f"grove_session={session}"
        return self.router.http("GET", path, auth=False, headers=headers)

    def console_problems(self) -> list[str]:
        """Console messages since the last call that say a script failed or the CSP blocked something."""
        found = [str(entry.get("message", "")) for entry in self.browser.get_log("browser")]
        return [m for m in found if "Content Security Policy" in m or "Uncaught" in m]

    def fetch_in_page(self, method: str, path: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """A fetch() from the page itself (its origin, its cookie): ``{"status", "body"}``."""
        script = """
            const [method, path, headers, done] = arguments;
            fetch(path, {method, headers, credentials: "same-origin"})
              .then(async (r) => done({status: r.status, body: await r.text()}))
              .catch((e) => done({status: -1, body: String(e)}));
        """
        return dict(self.browser.execute_async_script(script, method, path, headers or {}))


@pytest.fixture(scope="module")
def viewer(router: RouterProcess, browser: WebDriver) -> Iterator[Viewer]:
    """The module's router seen through the module's browser."""
    spool = Path(tempfile.mkdtemp(prefix="grove-ui-spool-"))
    browser.set_script_timeout(30)
    try:
        yield Viewer(router, browser, spool)
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll a plain predicate (no browser) until truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
