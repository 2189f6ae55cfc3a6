"""The viewer in a real browser: login, the live pages, search, a trajectory, comparing, deleting, scale, runs."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from grove.client import Grove
from grove.rollouts.plots import draw
from grove.rollouts.report import groups_of, summarize
from tests.support.router_fixtures import RouterProcess
from tests.ui.conftest import Viewer, until
from tests.ui.samples import episode, full_output, huge

# Stores records behind the router's back in its embedded S3 (tests/ui/conftest.py).
pytestmark = pytest.mark.embedded_s3

OPEN_BOUND_S = 8.0
"""A 2,000-step, 50 MB trajectory shows its header and first steps within this (cold: from S3)."""


def test_login_refuses_a_wrong_key_and_keeps_the_right_one_out_of_urls(viewer: Viewer) -> None:
    viewer.open("/ui/trajectories")
    viewer.wait(lambda: "/ui/login" in viewer.browser.current_url, what="the redirect to the login form")
    viewer.snap("login")
    viewer.browser.find_element("id", "key").send_keys("grove_not-a-key")
    viewer.browser.find_element("id", "login-button").click()
    error = viewer.wait(lambda: viewer.css("#login-error"), what="the wrong key's message")[0]
    assert "not valid" in error.text
    assert viewer.browser.get_cookie("grove_session") is None
    viewer.browser.find_element("id", "key").send_keys(viewer.router.key)
    viewer.browser.find_element("id", "login-button").click()
    # Back where the reader was going, with an HttpOnly, SameSite=Strict session cookie no script can read.
    viewer.wait(lambda: viewer.browser.current_url.endswith("/ui/trajectories"), what="the page asked for")
    cookie = viewer.browser.get_cookie("grove_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert cookie["value"] != viewer.router.key and "expiry" in cookie
    assert "grove_session" not in viewer.browser.execute_script("return document.cookie")
    assert viewer.router.key not in viewer.browser.current_url


def test_the_api_still_wants_its_bearer_key_and_the_viewer_its_session(viewer: Viewer) -> None:
    session = viewer.session()
    assert viewer.get("/v1/sandboxes", session).status == 401  # a cookie opens nothing of the API
    assert viewer.get("/ui/api/sandboxes", None).status == 401
    assert viewer.get("/ui/api/sandboxes", "forged").status == 401
    reply = viewer.router.http("GET", "/ui/api/sandboxes")  # nor does the bearer key open the viewer's calls
    assert reply.status == 401
    page = viewer.get("/ui/", None)
    assert page.status == 303 and page.headers["Location"].startswith("/ui/login?next=")
    ok = viewer.get("/ui/api/sandboxes", session)
    assert ok.status == 200 and "sandboxes" in ok.json()
    for path in ("/ui/", "/ui/login", "/ui/static/common.js", "/ui/api/sandboxes", "/ui/api/trajectories/nope"):
        headers = viewer.get(path, session).headers
        assert "script-src 'self'" in headers["Content-Security-Policy"], path
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
        assert "unsafe-inline" not in headers["Content-Security-Policy"], path
        assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff", path
    spec = viewer.router.http("GET", "/v1/openapi.json").json()
    assert not [p for p in spec["paths"] if p.startswith("/ui")]
    # A login's redirect never leaves the viewer.
    body = b"key=" + viewer.router.key.encode() + b"&next=//evil.example/x"
    reply = viewer.router.http("POST", "/ui/login", body, auth=False,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert reply.status == 303 and reply.headers["Location"] == "/ui/"


def test_logout_ends_the_session_and_needs_its_token(viewer: Viewer) -> None:
    viewer.login()
    old = viewer.browser.get_cookie("grove_session")
    assert old is not None
    forged = viewer.router.http("POST", "/ui/logout", b"csrf=guessed", auth=False, headers={
        "Cookie": f"grove_session={old['value']}", "Content-Type": "application/x-www-form-urlencoded"})
    assert forged.status == 403 and viewer.get("/ui/api/sandboxes", old["value"]).status == 200
    viewer.browser.find_element("id", "logout").click()
    viewer.wait(lambda: viewer.css("#key"), what="the login form")
    assert viewer.browser.get_cookie("grove_session") is None
    assert viewer.get("/ui/api/sandboxes", old["value"]).status == 401
    viewer.open("/ui/")
    viewer.wait(lambda: "/ui/login" in viewer.browser.current_url, what="the login form again")
    # Another site cannot log this browser in (into a session of its own key).
    body = b"key=" + viewer.router.key.encode()
    reply = viewer.router.http("POST", "/ui/login", body, auth=False, headers={
        "Origin": "http://evil.example", "Content-Type": "application/x-www-form-urlencoded"})
    assert reply.status == 403 and "Set-Cookie" not in reply.headers


def test_a_revoked_keys_sessions_end(viewer: Viewer) -> None:
    added = viewer.router.cli("key", "add", "viewer-test")
    assert added.returncode == 0, added.stderr
    key = next(w for w in added.stdout.decode().split() if w.startswith("grove_"))
    # The router re-reads its key file within a second.
    session = until(lambda: viewer.try_session(key), 5, "the new key to be accepted")
    assert viewer.get("/ui/api/sandboxes", session).status == 200
    revoked = viewer.router.cli("key", "revoke", key)
    assert revoked.returncode == 0, revoked.stderr
    until(lambda: viewer.get("/ui/api/sandboxes", session).status == 401, 5, "the session to end")
    assert viewer.get("/ui/", session).status == 303


def test_live_sandboxes_are_listed_filtered_and_refreshed(viewer: Viewer, grove: Grove) -> None:
    viewer.login()
    a = grove.create(heartbeat=False, metadata={"task_id": "astropy-1", "model": "m-large", "harness": "mini"})
    b = grove.create(heartbeat=False, metadata={"task_id": "django-7", "model": "m-small", "harness": "swe-agent",
                                                "harness_version": "1.1"})
    # The page refreshes by itself: both appear without a reload.
    viewer.wait(lambda: len(viewer.css(f'tr[data-id="{a.id}"], tr[data-id="{b.id}"]')) == 2, what="both rows")
    row = viewer.css(f'tr[data-id="{b.id}"]')[0].text
    assert "django-7" in row and "m-small" in row and "swe-agent 1.1" in row and "ready" in row
    viewer.snap("sandboxes")
    assert not viewer.console_problems()
    viewer.browser.find_element("id", "f-task").send_keys("astro")
    viewer.wait(lambda: [r.get_attribute("data-id") for r in viewer.css("#sandboxes tbody tr")] == [a.id],
                what="the task filter")
    viewer.browser.find_element("id", "f-task").clear()
    viewer.browser.find_element("id", "f-model").send_keys("m-small")
    viewer.wait(lambda: [r.get_attribute("data-id") for r in viewer.css("#sandboxes tbody tr")] == [b.id],
                what="the model filter")
    b.close()
    viewer.browser.find_element("id", "f-model").clear()
    viewer.wait(lambda: not viewer.css(f'tr[data-id="{b.id}"]'), what="the deleted sandbox to leave the list")


def test_a_trajectory_the_router_stored_shows_its_task_model_and_harness(viewer: Viewer, grove: Grove) -> None:
    """Made end to end: a sandbox with metadata, a command, deleted (the router stores its record), then its
    page. Every stored trajectory showed Task, Model and Harness as "—" while the fixtures had another shape."""
    meta = {"task_id": "stored-task", "model": "m-stored", "harness": "h-stored", "harness_version": "9.1",
            "labels": {"run_id": "run-stored"}}
    sandbox = grove.create(heartbeat=False, metadata=meta)
    sandbox.exec("echo stored")
    sandbox.close()
    viewer.login()
    viewer.wait(lambda: viewer.get(f"/ui/api/trajectories/{sandbox.id}", viewer.session()).status == 200,
                what="the record in S3")
    viewer.open(f"/ui/trajectories/{sandbox.id}")
    viewer.wait(lambda: "echo stored" in viewer.text("#timeline"), what="the steps")
    shown = viewer.text("#meta")
    for expected in ("Task\nstored-task", "Model\nm-stored", "Harness\nh-stored 9.1", "Run\nrun-stored"):
        assert expected in shown, (expected, shown)
    assert viewer.css("#same-task"), "no link to the other attempts at this task"
    viewer.open("/ui/trajectories?task_id=stored-task")
    row = viewer.wait(lambda: viewer.css(f'tr[data-id="{sandbox.id}"]'), what="the search result")[0]
    assert "m-stored" in row.text and "h-stored" in row.text


def test_the_sandbox_page_follows_new_steps(viewer: Viewer, grove: Grove) -> None:
    viewer.login()
    sandbox = grove.create(heartbeat=False, metadata={"task_id": "live-task", "model": "m"})
    sandbox.exec("echo first")
    viewer.open(f"/ui/sandboxes/{sandbox.id}")
    viewer.wait(lambda: "echo first" in viewer.text("#timeline"), what="the first step")
    assert "live-task" in viewer.text("#config") and "m" in viewer.text("#config")
    sandbox.exec("printf '\\033[32mgreen\\033[0m and more\\n'")
    step = viewer.wait(lambda: [s for s in viewer.css("#timeline .step.exec") if "green" in s.text],
                       what="the new step")
    step[0].find_element("css selector", "details.stdout summary").click()
    span = viewer.wait(lambda: viewer.css("#timeline details.stdout pre .ansi-fg-2"), what="the output")[0]
    assert span.text == "green"
    viewer.snap("sandbox")
    assert not viewer.console_problems()


def test_deleting_a_sandbox_needs_the_csrf_token(viewer: Viewer, grove: Grove) -> None:
    viewer.login()
    sandbox = grove.create(heartbeat=False)
    viewer.open(f"/ui/sandboxes/{sandbox.id}")
    viewer.wait(lambda: viewer.text("#status") == "ready", what="the sandbox's status")
    path = f"/ui/api/sandboxes/{sandbox.id}/delete"
    for headers in ({}, {"X-CSRF-Token": "guessed"}):
        answer = viewer.fetch_in_page("POST", path, headers)
        assert answer["status"] == 403 and "CSRF" in json.loads(answer["body"])["error"]["message"], answer
    assert grove.request("GET", f"/v1/sandboxes/{sandbox.id}")["status"] == "ready"
    button = viewer.browser.find_element("id", "delete")
    button.click()
    assert button.text == "Click again to delete"
    button.click()
    viewer.wait(lambda: viewer.text("#status") == "deleted", what="the deletion")
    assert grove.request("GET", f"/v1/sandboxes/{sandbox.id}")["status"] == "deleted"


def test_trajectories_are_searched_and_paged(viewer: Viewer) -> None:
    viewer.store(
        episode("sb-search0000000001", task="astropy-1", model="m-large", result="pass", run_id="run-a", day=0),
        episode("sb-search0000000002", task="astropy-1", model="m-small", result="fail", run_id="run-a", day=1),
        episode("sb-search0000000003", task="django-7", model="m-large", result="infra_error", faults=2, day=2),
        episode("sb-search0000000004", task="django-7", harness="swe-agent", result=None, run_id="run-b", day=3),
        episode("sb-search0000000005", task="django-7", model="m-small", result="pass", faults=1, day=4),
    )
    viewer.login()
    viewer.open("/ui/trajectories")
    viewer.wait(lambda: len(viewer.css("#trajectories tbody tr[data-id^='sb-search']")) == 5, what="every record")
    shown = [r.get_attribute("data-id") for r in viewer.css("#trajectories tbody tr[data-id^='sb-search']")]
    assert shown == [f"sb-search000000000{n}" for n in (5, 4, 3, 2, 1)]  # newest first
    viewer.snap("trajectories")

    def search(**fields: str) -> list[str]:
        for name in ("q-task", "q-model", "q-harness", "q-run"):
            viewer.browser.find_element("id", name).clear()
        viewer.browser.execute_script("document.getElementById('q-outcome').value = arguments[0];"
                                      "document.getElementById('q-from').value = arguments[1];",
                                      fields.pop("outcome", ""), fields.pop("date_from", ""))
        for name, value in fields.items():
            viewer.browser.find_element("id", name).send_keys(value)
        loads = viewer.browser.find_element("id", "trajectories").get_attribute("data-loads")
        viewer.browser.find_element("id", "q-go").click()
        viewer.wait(lambda: viewer.browser.find_element("id", "trajectories").get_attribute("data-loads") != loads,
                    what="the results")
        return [r.get_attribute("data-id") for r in viewer.css("#trajectories tbody tr[data-id^='sb-search']")]

    assert search(outcome="infra_error") == ["sb-search0000000003"]
    assert search(outcome="faults") == ["sb-search0000000005", "sb-search0000000003"]
    assert search(**{"q-run": "run-a"}) == ["sb-search0000000002", "sb-search0000000001"]
    assert search(**{"q-task": "django-7", "q-model": "m-small"}) == ["sb-search0000000005"]
    assert search(**{"q-harness": "swe-agent"}) == ["sb-search0000000004"]
    assert search(outcome="none") == ["sb-search0000000004"]
    assert search(date_from="2026-11-21") == ["sb-search0000000005", "sb-search0000000004"]
    assert "outcome=none" not in viewer.browser.current_url and "date_from=2026-11-21" in viewer.browser.current_url
    # Pages come from the index with a cursor; none is repeated, none skipped.
    session = viewer.session()
    seen: list[str] = []
    after = ""
    while True:
        page = viewer.get(f"/ui/api/trajectories?task_id=&limit=2{after}", session).json()
        seen += [s["sandbox_id"] for s in page["items"] if s["sandbox_id"].startswith("sb-search")]
        if not page["next"]:
            break
        after = "&after=" + urllib.request.quote(page["next"], safe="")
    assert seen == [f"sb-search000000000{n}" for n in (5, 4, 3, 2, 1)]
    bad = viewer.get("/ui/api/trajectories?outcome=great", session)
    assert bad.status == 400 and "outcome must be one of" in bad.json()["error"]["message"]


def test_a_trajectory_shows_its_record_and_loads_outputs_when_opened(viewer: Viewer) -> None:
    record = episode("sb-episode000000001", task="astropy-1", result="fail", faults=1, run_id="run-a")
    viewer.store(record)
    key, full = full_output(record)
    viewer.put_object(key, full)
    viewer.login()
    viewer.open("/ui/trajectories/sb-episode000000001")
    viewer.wait(lambda: len(viewer.css("#timeline .step")) == len(record["steps"]), what="the steps")
    meta = viewer.text("#meta")
    for expected in ("sha256:" + "ab" * 32, "astropy-1", "mini-swe-agent 1.2.3", "model-a", "run-a",
                     "memory 1024 MB", "deny"):
        assert expected in meta, expected
    assert "fail" in viewer.text("#outcome-result")
    assert "executor lost (0)" in viewer.text("#infra-faults")  # the environment's faults, set apart
    # Outputs are not in the page until opened.
    assert not viewer.css("#timeline pre.term")
    failing = next(s for s in viewer.css("#timeline .step.exec") if "pytest -q" in s.text)
    assert "exit 1" in failing.text and "cwd /repo" in failing.text and "user agent" in failing.text
    failing.find_element("css selector", "details.stdout summary").click()
    red = viewer.wait(lambda: failing.find_elements("css selector", "pre.term .ansi-fg-1"), what="the output")
    assert red[0].text == "FAILED"
    assert "\x1b" not in failing.find_element("css selector", "pre.term").text
    transfer = next(s for s in viewer.css("#timeline .step.transfer") if "/repo/fixtures" in s.text).text
    assert "20 kB" in transfer and "2" * 64 in transfer
    conversation = viewer.text("#timeline")
    assert "Fix the bug." in conversation and "→ bash" in conversation and '"command": "pytest -q"' in conversation
    viewer.snap("trajectory")
    assert not viewer.console_problems()  # no script error, nothing the CSP had to block
    # The truncated output links to its whole text in S3 through a presigned GET.
    big = next(s for s in viewer.css("#timeline .step.exec") if "cat big.log" in s.text)
    assert "truncated" in big.text
    link = big.find_element("css selector", "a.full").get_attribute("href")
    session = viewer.session()
    redirect = viewer.get(link.removeprefix(viewer.router.url), session)
    assert redirect.status == 303 and "X-Amz-Signature" in redirect.headers["Location"]
    with urllib.request.urlopen(redirect.headers["Location"], timeout=10) as answer:
        assert answer.read() == full
    raw = viewer.get("/ui/api/trajectories/sb-episode000000001/raw", session)
    assert raw.status == 200 and "attachment" in raw.headers["Content-Disposition"] and len(raw.body) > 4096
    # On to the other attempts at the task, and to the rest of the run.
    viewer.browser.find_element("id", "same-task").click()
    row = viewer.wait(lambda: viewer.css('tr[data-id="sb-episode000000001"]'), what="the task's attempts")[0]
    assert "/ui/trajectories?task_id=astropy-1" in viewer.browser.current_url
    row.find_element("link text", "run-a").click()
    viewer.wait(lambda: viewer.browser.current_url.endswith("/ui/trajectories?run_id=run-a"), what="the run")
    viewer.wait(lambda: viewer.css('tr[data-id="sb-episode000000001"]'), what="the run's attempts")
    assert viewer.browser.find_element("id", "q-run").get_attribute("value") == "run-a"


def test_two_trajectories_side_by_side(viewer: Viewer) -> None:
    viewer.store(episode("sb-compare00000001", model="m-large", result="pass"),
                 episode("sb-compare00000002", model="m-small", result="fail"))
    viewer.login()
    viewer.open("/ui/trajectories?task_id=task-1")
    for sid in ("sb-compare00000001", "sb-compare00000002"):
        box = viewer.wait(lambda sid=sid: viewer.css(f'tr[data-id="{sid}"] input'), what=sid)[0]
        box.click()
    viewer.browser.find_element("id", "compare").click()
    steps = len(episode("x")["steps"])
    viewer.wait(lambda: len(viewer.css("#aligned tbody tr.pair")) == steps, what="aligned steps")
    assert "m-large" in viewer.text("#side-a") and "m-small" in viewer.text("#side-b")
    first = viewer.css("#aligned tbody tr.pair")[3].text
    assert first.count("ls /repo") == 2
    # Records without phases are all the agent's (tests/ui/test_changes.py compares rollouts phase by phase).
    assert [t.text for t in viewer.css("#aligned tr.phase-row th")] == [f"Agent — A: {steps} steps · B: {steps} steps"]
    assert not viewer.console_problems()


def test_a_2000_step_50mb_trajectory_opens_fast(viewer: Viewer, router: RouterProcess) -> None:
    viewer.store(huge("sb-huge00000000001"))
    viewer.login()
    started = time.monotonic()
    viewer.open("/ui/trajectories/sb-huge00000000001")
    viewer.wait(lambda: viewer.text("#step-count") == "2000 steps" and len(viewer.css("#timeline .step")) >= 250,
                timeout=OPEN_BOUND_S, what="the header and the first page of steps")
    took = time.monotonic() - started
    assert took < OPEN_BOUND_S
    # What crossed the wire is outlines, not 50 MB of output.
    sizes = viewer.browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('/ui/api/trajectories/'))"
        ".map(e => e.encodedBodySize)")
    assert sizes and max(sizes) < 1_000_000, sizes
    last = viewer.css("#timeline .step")[-1]
    last.find_element("css selector", "details.stdout summary").click()
    viewer.wait(lambda: "0123456789abcdef" in last.text, what="one output, loaded alone")
    viewer.browser.find_element("id", "more-steps").click()
    viewer.wait(lambda: len(viewer.css("#timeline .step")) == 500, what="the next page of steps")
    print(f"2,000-step trajectory: header and first 250 steps shown in {took:.2f}s")


def test_a_rollout_run_shows_pass_at_k_groups_faults_plots_and_attempts(viewer: Viewer, tmp_path: Path) -> None:
    # The run's files as `grove rollouts` writes them (its own summarize, groups_of and plots).
    viewer.store(episode("sb-runattempt00001", task="astropy-1", model="m-large", run_id="run-v1"))
    run = {"run_id": "run-v1", "spec": {"variants": [["mini-swe-agent", "m-large"], ["mini-swe-agent", "m-small"]]}}
    results = []
    for v, model in enumerate(("m-large", "m-small")):
        for task in ("astropy-1", "django-7"):
            for attempt in range(3):
                lost = (v, task, attempt) == (1, "django-7", 2)
                outcome = "infra_error" if lost else ("pass" if (attempt + v) % 2 == 0 else "fail")
                results.append({
                    "run_id": "run-v1", "variant": v, "task": task, "attempt": attempt, "group_id": f"{task}-v{v}",
                    "outcome": outcome, "reward": 1.0 if outcome == "pass" else 0.0, "harness": "mini-swe-agent",
                    "harness_version": "2.4", "model": model, "tries": 2 if lost else 1,
                    "infra_errors": ["POST /v1/exec: executor lost"] if lost else [],
                    "trajectory_id": "sb-runattempt00001" if (v, task, attempt) == (0, "astropy-1", 0) else None})
    summary = summarize(run, results)
    files = {"summary.json": json.dumps(summary).encode(),
             "groups.jsonl": "".join(json.dumps(g) + "\n" for g in groups_of(results)).encode()}
    for name in draw(tmp_path, summary, results):
        files[name] = (tmp_path / name).read_bytes()
    for name, data in files.items():
        viewer.put_object(f"runs/run-v1/{name}", data)
    viewer.login()
    viewer.open("/ui/runs")
    viewer.wait(lambda: viewer.css("#runs a"), what="the runs")[0].click()
    viewer.wait(lambda: len(viewer.css("#groups tbody tr")) == 4, what="the run's groups")
    variants = viewer.text("#variants")
    assert "m-large" in variants and "pass@1" in variants and "pass@3" in variants
    assert "POST /v1/exec: executor lost" in viewer.text("#faults")
    assert "1/2 +1 lost" in viewer.text("#tasks")  # m-small on django-7: one attempt lost to the environment
    plots = viewer.wait(lambda: [i for i in viewer.css("#plots img")
                                 if viewer.browser.execute_script("return arguments[0].naturalWidth", i) > 0],
                        what="the plots to load")
    assert len(plots) == len(files) - 2
    viewer.snap("run")
    assert not viewer.console_problems()
    session = viewer.session()
    assert viewer.get("/ui/api/runs/run-v1/plots/summary.json", session).status == 400  # a plot is a PNG
    assert viewer.get("/ui/api/runs/.hidden", session).status == 400
    assert viewer.get("/ui/api/runs/no-such-run", session).status == 404
    viewer.browser.find_element("css selector", "#groups a.attempt").click()
    viewer.wait(lambda: viewer.text("#step-count") == "14 steps", what="the attempt's trajectory")  # its result too
    assert "/ui/trajectories/sb-runattempt00001" in viewer.browser.current_url
