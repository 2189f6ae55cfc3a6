"""The world the projects tests build on one real router, and the HTTP calls the tests make in it.

Two projects, alpha and beta, each with a member key (and a viewer session opened with it), and the operator's
admin key. alpha holds the things worth stealing: a live sandbox, a deleted one whose record and artifacts are
stored, an unclaimed warm-pool member, a pool, a run; beta holds a few of its own. :func:`make_world` builds it
through the router's own API and CLI; :func:`call`, :func:`api` and :func:`viewer` make the calls;
:func:`refused_as_unknown` and :func:`names_nothing_of_alphas` check what beta gets back.
"""

from __future__ import annotations

import json
import secrets
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, fields
from html.parser import HTMLParser
from http.cookies import SimpleCookie
from typing import Any

from router.records.registry import new_id
from tests.support.executor_fixtures import Reply
from tests.support.router_fixtures import RouterProcess, wait_for

TAG = secrets.token_hex(4)
ALPHA, BETA = "alpha", "beta"
PROJECT = "X-Grove-Project"
ALPHA_META = {"task_id": f"alpha-task-{TAG}", "model": f"alpha-model-{TAG}", "harness": f"alpha-harness-{TAG}",
              "labels": {"run_id": f"alpha-run-{TAG}"}}


@dataclass
class Who:
    """A caller: an API key and a viewer session opened with it."""

    key: str
    session: str = ""
    csrf: str = ""


@dataclass(frozen=True)
class Names:
    """What fills a route's parts: alpha's real ones, or (:meth:`unknown`) ones that never existed."""

    live: str
    """A live sandbox."""
    ended: str
    """A deleted sandbox, its record and artifacts stored."""
    member: str
    """An unclaimed member of a warm pool (no one reaches it before its claim, alpha neither)."""
    pool: str
    run: str
    project: str

    def unknown(self) -> Names:
        return Names(new_id(), new_id(), new_id(), f"nopool-{secrets.token_hex(4)}", f"norun-{secrets.token_hex(4)}",
                     f"nobody-{secrets.token_hex(4)}")

    def pairs(self, other: Names) -> list[tuple[str, str]]:
        return [(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)]


@dataclass
class World:
    """What the module's router holds: alpha's things, beta's own, and the three callers."""

    router: RouterProcess
    alpha: Who
    beta: Who
    admin: Who
    names: Names
    artifact: str
    """The path of the file alpha pushed from each of its sandboxes."""
    exec_step: int
    """The step (in both of alpha's records) whose stdout was truncated and stored whole."""
    file_step: int
    twin: str
    """A pool name both projects use."""
    beta_live: str
    beta_ended: str
    beta_run: str
    markers: tuple[str, ...]
    """Strings that only alpha's data holds: none may be in an answer to beta that its request did not hold."""
    screenshot: str = ""
    """The sha256 of a screenshot alpha took in each of its sandboxes, a computer step of both its records
    (stored in alpha's part of the bucket); the live sandbox's screen keeps running."""
    checkpoint: str = ""
    """A checkpoint alpha took of its live sandbox."""


@dataclass(frozen=True)
class Probe:
    """One call of a route with its parts filled."""

    method: str
    path: str
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    control: bool = True
    """alpha makes the call first and must succeed (2xx or 3xx). False where alpha's call would destroy what
    other cases need (a delete); ``test_alphas_things_are_untouched`` checks those survived beta."""
    stored: bool = False
    """It reaches what is stored of a deleted sandbox, also once the router forgot it."""


def get(path: str, *, stored: bool = False) -> Probe:
    return Probe("GET", path, stored=stored)


def send(method: str, path: str, body: Any = None, *, control: bool = True, raw: bytes | None = None) -> Probe:
    data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
    kind = "application/octet-stream" if raw is not None else "application/json"
    return Probe(method, path, data, (("Content-Type", kind),), control)


def both(path: Callable[[str], str], *, stored: bool = False) -> Callable[[World, Names], list[Probe]]:
    """GETs of the live and of the deleted sandbox (``stored``: the deleted one's answer comes from S3)."""
    return lambda w, n: [get(path(n.live)), get(path(n.ended), stored=stored)]


# -- calls ------------------------------------------------------------------------------------------------------

def call(w: World, who: Who, probe: Probe) -> Reply:
    """``probe`` as ``who``: with its key on the API (in ``X-API-Key`` where the probe names that header),
    with its session cookie (and CSRF token on a POST) on the viewer."""
    headers = dict(probe.headers)
    if probe.path.startswith("/ui"):
        headers["Cookie"] = f"grove_session={who.session}"
        if probe.method == "POST":
            headers["X-CSRF-Token"] = who.csrf
        return w.router.http(probe.method, probe.path, probe.body, headers=headers, auth=False)
    if "X-API-Key" in headers:
        headers["X-API-Key"] = who.key
        return w.router.http(probe.method, probe.path, probe.body, headers=headers, auth=False)
    return w.router.http(probe.method, probe.path, probe.body, headers=headers, key=who.key)


def api(w: World, who: Who, method: str, path: str, body: Any = None, *, status: int = 200,
        headers: dict[str, str] | None = None) -> Any:
    """An API call whose answer must be ``status``; its JSON."""
    reply = w.router.http(method, path, json_body=body, headers=headers, key=who.key) if body is not None else \
        w.router.http(method, path, headers=headers, key=who.key)
    assert reply.status == status, (method, path, reply.status, reply.body[:500])
    return reply.json() if reply.body and "json" in (reply.headers.get("Content-Type") or "") else None


def viewer(w: World, who: Who, path: str, *, status: int = 200) -> Any:
    """A viewer JSON call with ``who``'s session."""
    reply = call(w, who, get(path))
    assert reply.status == status, (path, reply.status, reply.body[:500])
    return reply.json()


def call_status(router: RouterProcess, who: Who, path: str) -> int:
    """The status of a viewer GET with ``who``'s session (usable before there is a :class:`World`)."""
    return router.http("GET", path, auth=False, headers={"Cookie": f"grove_session={who.session}"}).status


def names_nothing_of_alphas(w: World, asked: Probe | str, reply: Reply) -> None:
    """No marker of alpha's data in the answer (headers included) unless the request itself held it."""
    request = asked if isinstance(asked, str) else asked.path + (asked.body or b"").decode(errors="replace") + \
        "".join(value for _, value in asked.headers)  # a sandbox named in a header (E2B's E2b-Sandbox-Id)
    answer = reply.body.decode(errors="replace") + str(reply.headers)
    named = [m for m in w.markers if m not in request and m in answer]
    assert not named, (request, named, reply.body[:500])


def refused_as_unknown(w: World, build: Callable[[World, Names], list[Probe]], names: Names,
                       *, stored_only: bool = False) -> None:
    """Each probe: alpha's call succeeds; beta's is a 404 that names nothing of alpha's and is exactly the
    answer beta gets with the names replaced by ones that never existed."""
    unknown = names.unknown()
    probes, doubles = build(w, names), build(w, unknown)
    assert len(probes) == len(doubles)
    ran = 0
    for probe, double in zip(probes, doubles, strict=True):
        if stored_only and not probe.stored:
            continue
        ran += 1
        if probe.control:
            mine = call(w, w.alpha, probe)
            assert 200 <= mine.status < 400, ("alpha's own call failed", probe.path, mine.status, mine.body[:300])
        theirs, never = call(w, w.beta, probe), call(w, w.beta, double)
        assert theirs.status == 404, (probe.method, probe.path, theirs.status, theirs.body[:500])
        names_nothing_of_alphas(w, probe, theirs)
        expected = never.body
        for real, fake in names.pairs(unknown):
            expected = expected.replace(fake.encode(), real.encode())
        assert (never.status, never.headers.get("Content-Type"), expected) == \
               (theirs.status, theirs.headers.get("Content-Type"), theirs.body), (
            "beta can tell alpha's from an unknown one", probe.path, theirs.body[:300], never.body[:300])
    assert ran, "no probe ran"


# -- the world ----------------------------------------------------------------------------------------------

class _Meta(HTMLParser):
    """The CSRF token of a viewer page (its ``<meta name="csrf-token">``)."""

    csrf = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "meta" and found.get("name") == "csrf-token":
            self.csrf = found.get("content") or ""


def logged_in(router: RouterProcess, key: str) -> Who:
    """``key`` with a viewer session opened through the login form, and the session's CSRF token."""
    form = urllib.parse.urlencode({"key": key, "next": "/ui/"}).encode()
    reply = router.http("POST", "/ui/login", form, auth=False,
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert reply.status == 303, reply.body[:300]
    session = SimpleCookie(reply.headers["Set-Cookie"])["grove_session"].value
    page = router.http("GET", "/ui/", auth=False, headers={"Cookie": f"grove_session={session}"})
    parser = _Meta()
    parser.feed(page.body.decode())
    assert parser.csrf, page.body[:300]
    return Who(key, session, parser.csrf)


def _ok(reply: Reply, status: int = 200) -> Any:
    assert reply.status == status, (reply.status, reply.body[:500])
    return reply.json() if reply.body else None


def _sandbox(router: RouterProcess, key: str, project: str, body: dict[str, Any]) -> str:
    """A sandbox with a record worth stealing: a file, a file write, a truncated output stored whole, an event
    and a pushed artifact, each holding the project's markers."""
    sid = str(_ok(router.http("POST", "/v1/sandboxes", json_body=body, key=key), 201)["id"])
    run = [f"echo {project}-secret-{TAG} > /workspace/out.txt; echo doomed > /workspace/doomed.txt",
           f"yes {project}-output-{TAG} | head -c 200000"]
    _ok(router.http("POST", f"/v1/sandboxes/{sid}/exec", json_body={"command": run[0]}, key=key))
    _ok(router.http("PUT", f"/v1/sandboxes/{sid}/files?path=/workspace/notes.txt", f"{project}-notes-{TAG}".encode(),
                    key=key), 201)
    _ok(router.http("POST", f"/v1/sandboxes/{sid}/exec", json_body={"command": run[1], "max_output_bytes": 4096},
                    key=key))
    _ok(router.http("POST", f"/v1/sandboxes/{sid}/events", key=key, json_body={
        "kind": "message", "data": {"role": "assistant", "content": f"{project}-event-{TAG}"}}))
    _ok(router.http("POST", f"/v1/sandboxes/{sid}/artifacts", json_body={"paths": ["out.txt"]}, key=key))
    return sid


def _steps(router: RouterProcess, key: str, sid: str) -> tuple[int, int]:
    steps = _ok(router.http("GET", f"/v1/sandboxes/{sid}/trajectory", key=key))["steps"]
    truncated = [i for i, s in enumerate(steps) if s.get("stdout_artifact")]
    files = [i for i, s in enumerate(steps) if s.get("type") == "file_write"]
    assert truncated and files, steps
    return truncated[0], files[0]


def _delete_and_store(router: RouterProcess, key: str, sid: str, task: str) -> None:
    _ok(router.http("DELETE", f"/v1/sandboxes/{sid}", key=key))
    wait_for(lambda: not router.layout.journal(sid).exists() and sid in json.dumps(
        _ok(router.http("GET", f"/v1/trajectories?task_id={task}", key=key))), 30, what=f"{sid} stored")


def _put_run(router: RouterProcess, key: str, run: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        _ok(router.http("PUT", f"/v1/runs/{run}/files/{name}", data, key=key), 201)


def cleanup(router: RouterProcess) -> None:
    """Every project's sandboxes and pools, deleted through the admin key while the router runs."""
    everyone = {"X-Grove-Project": "*"}
    for pool in router.http("GET", "/v1/pools", headers=everyone).json().get("pools", []):
        router.http("DELETE", f"/v1/pools/{pool['name']}", headers={"X-Grove-Project": pool["project"]})
    for sandbox in router.http("GET", "/v1/sandboxes", headers=everyone).json().get("sandboxes", []):
        router.http("DELETE", f"/v1/sandboxes/{sandbox['id']}")



def make_world(router: RouterProcess) -> World:
    """alpha's things (live and deleted sandboxes, a pool, a run), beta's own, and the three callers."""
    alpha_key, beta_key = router.member_key(ALPHA, f"{ALPHA}-member"), router.member_key(BETA, f"{BETA}-member")
    meta = ALPHA_META
    live = _sandbox(router, alpha_key, ALPHA, {"request_id": f"alpha-req-{TAG}", "metadata": meta})
    ended = _sandbox(router, alpha_key, ALPHA, {"metadata": meta})
    steps = _steps(router, alpha_key, live)
    assert _steps(router, alpha_key, ended) == steps
    alpha = logged_in(router, alpha_key)
    for sid in (live, ended):  # the full output goes up in the background: wait for it while the sandbox lives
        wait_for(lambda sid=sid: call_status(router, alpha, f"/ui/api/trajectories/{sid}/steps/{steps[0]}/stdout/full")
                 == 303, 30, what="the full output in S3")
    shots = {_ok(router.http("POST", f"/v1/sandboxes/{sid}/computer", json_body={"action": "screenshot"},
                             key=alpha_key))["screenshot"]["sha256"] for sid in (live, ended)}
    assert len(shots) == 1, shots  # the same blank screen in both: the stored record names it too
    screenshot = shots.pop()
    checkpoint = _ok(router.http("POST", f"/v1/sandboxes/{live}/checkpoints", json_body={}, key=alpha_key), 201)["id"]
    _delete_and_store(router, alpha_key, ended, f"alpha-task-{TAG}")
    listed = _ok(router.http("GET", f"/v1/sandboxes/{live}/artifacts", key=alpha_key))["artifacts"]
    artifact = next(a["path"] for a in listed if a["path"].endswith("/out.txt")).lstrip("/")

    pool, twin = f"alpha-pool-{TAG}", f"twin-{TAG}"
    _ok(router.http("POST", "/v1/pools", json_body={"name": pool, "size": 1}, key=alpha_key), 201)
    for key in (alpha_key, beta_key):
        _ok(router.http("POST", "/v1/pools", json_body={"name": twin, "size": 0}, key=key), 201)
    wait_for(lambda: _ok(router.http("GET", f"/v1/pools/{pool}", key=alpha_key))["ready"] == 1, 30,
             what="alpha's pool member")
    members = {json.loads(p.read_text())["id"] for p in router.layout.records.glob("sb-*.json")
               if json.loads(p.read_text()).get("pool") == f"{ALPHA}.{pool}"}
    assert len(members) == 1, members

    run, beta_run = f"alpha-run-{TAG}", f"beta-run-{TAG}"
    png = b"\x89PNG\r\n\x1a\n" + f"alpha-plot-{TAG}".encode()
    _put_run(router, alpha_key, run, {
        "summary.json": json.dumps({"note": f"alpha-summary-{TAG}", "variants": [{"model": f"alpha-model-{TAG}"}]}
                                   ).encode(),
        "run.json": json.dumps({"created_at": 1.0}).encode(), "groups.jsonl": b'{"task": "t"}\n', "plot.png": png})
    _put_run(router, beta_key, beta_run, {"summary.json": b"{}"})

    beta_meta = {"task_id": f"beta-task-{TAG}", "labels": {"run_id": beta_run}}
    beta_live = _sandbox(router, beta_key, BETA, {"metadata": beta_meta})
    beta_ended = _sandbox(router, beta_key, BETA, {"metadata": beta_meta})
    _delete_and_store(router, beta_key, beta_ended, f"beta-task-{TAG}")

    markers = (live, ended, *members, pool, run, f"alpha-task-{TAG}", f"alpha-model-{TAG}", f"alpha-harness-{TAG}",
               f"alpha-secret-{TAG}", f"alpha-notes-{TAG}", f"alpha-output-{TAG}", f"alpha-event-{TAG}",
               f"alpha-summary-{TAG}", f"alpha-plot-{TAG}", f"projects/{ALPHA}/", ALPHA, checkpoint)
    names = Names(live, ended, members.pop(), pool, run, ALPHA)
    return World(router, alpha, logged_in(router, beta_key), Who(router.key), names, artifact, steps[0], steps[1],
                 twin, beta_live, beta_ended, beta_run, markers, screenshot, checkpoint)
