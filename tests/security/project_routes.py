"""The route table of the projects tests: what beta must get from each route of the API and of the viewer.

A *case* (:data:`CASES`) is for a route that names one of alpha's things (a sandbox, a pool, a run, a project):
given the world and the names to fill in, it builds the probes (calls of the route with its parts filled) that
alpha makes and beta then repeats, and beta must get what an unknown name gets, a 404. A *check*
(:data:`CHECKS`) is for a route that names nothing of alpha's (a listing, a create, a write): a function that
makes its calls as alpha and beta and asserts beta sees and changes only its own. :data:`NO_SESSION` are the
viewer's routes that read nothing of a project's; :func:`route_ids` is every route, in the order tested.
"""

from __future__ import annotations

import io
import json
import secrets
import tarfile
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from router.api.routes import PORT_METHODS, ROUTES
from router.ui import UI_ROUTES
from tests.support.project_world import (
    ALPHA,
    ALPHA_META,
    BETA,
    TAG,
    Names,
    Probe,
    World,
    api,
    both,
    call,
    get,
    names_nothing_of_alphas,
    send,
    viewer,
)


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("untarred.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"x\n"))
    return buf.getvalue()


def _trajectory_probes(suffix: Callable[[World], str]) -> Callable[[World, Names], list[Probe]]:
    return lambda w, n: [get(f"/ui/api/trajectories/{n.live}{suffix(w)}"),
                         get(f"/ui/api/trajectories/{n.ended}{suffix(w)}", stored=True)]


def _screenshot_probes(w: World, n: Names) -> list[Probe]:
    """The screenshot of a computer step in alpha's records, whole and its thumbnail."""
    return [*_trajectory_probes(lambda w: f"/screenshots/{w.screenshot}")(w, n),
            *_trajectory_probes(lambda w: f"/screenshots/{w.screenshot}?thumb=1")(w, n)]


def _unchecked(method: str, suffix: str) -> Callable[[World, Names], list[Probe]]:
    """A call of alpha's live sandbox that alpha's own call does not pass (no server there to answer it)."""
    return lambda w, n: [replace(send(method, f"/v1/sandboxes/{n.live}{suffix}"), control=False)]


# Routes that name one of alpha's things: beta gets what an unknown name gets, a 404.
CASES: dict[tuple[str, str], Callable[[World, Names], list[Probe]]] = {
    ("GET", "/v1/sandboxes/{id}"): lambda w, n: [get(f"/v1/sandboxes/{n.live}"), get(f"/v1/sandboxes/{n.ended}"),
                                                 replace(get(f"/v1/sandboxes/{n.member}"), control=False)],
    ("DELETE", "/v1/sandboxes/{id}"): lambda w, n: [send("DELETE", f"/v1/sandboxes/{s}", control=False)
                                                    for s in (n.live, n.ended)],
    ("GET", "/v1/projects/{name}"): lambda w, n: [get(f"/v1/projects/{n.project}")],
    ("GET", "/v1/pools/{name}"): lambda w, n: [get(f"/v1/pools/{n.pool}")],
    ("PATCH", "/v1/pools/{name}"): lambda w, n: [send("PATCH", f"/v1/pools/{n.pool}", {"size": 1})],
    ("DELETE", "/v1/pools/{name}"): lambda w, n: [send("DELETE", f"/v1/pools/{n.pool}", control=False)],
    ("POST", "/v1/sandboxes/{id}/heartbeat"): lambda w, n: [send("POST", f"/v1/sandboxes/{n.live}/heartbeat")],
    # alpha's own commit of a sandbox on `default` is refused too (nothing is built on the host's /usr): no control.
    ("POST", "/v1/sandboxes/{id}/commit"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/commit", {"image": f"beta-{TAG}"}, control=False)],
    ("POST", "/v1/sandboxes/{id}/checkpoints"): lambda w, n: [send("POST", f"/v1/sandboxes/{n.live}/checkpoints")],
    ("GET", "/v1/sandboxes/{id}/checkpoints"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/checkpoints")],
    ("GET", "/v1/sandboxes/{id}/checkpoints/{checkpoint}"): lambda w, n: [
        get(f"/v1/sandboxes/{n.live}/checkpoints/{w.checkpoint}")],
    ("DELETE", "/v1/sandboxes/{id}/checkpoints/{checkpoint}"): lambda w, n: [
        send("DELETE", f"/v1/sandboxes/{n.live}/checkpoints/{w.checkpoint}", control=False)],
    # alpha's own fork and replay would make sandboxes the other cases do not expect: no control.
    ("POST", "/v1/sandboxes/{id}/fork"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/fork", {"count": 1}, control=False)],
    ("POST", "/v1/trajectories/{sandbox_id}/replay"): lambda w, n: [
        send("POST", f"/v1/trajectories/{sid}/replay", {"keep": False}, control=False) for sid in (n.live, n.ended)],
    ("POST", "/v1/sandboxes/{id}/exec"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/exec", {"command": "true"}),
        send("POST", f"/v1/sandboxes/{n.member}/exec", {"command": "true"}, control=False)],
    ("POST", "/v1/sandboxes/{id}/computer"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/computer", {"action": "cursor_position"}),
        send("POST", f"/v1/sandboxes/{n.member}/computer", {"action": "cursor_position"}, control=False)],
    ("POST", "/v1/sandboxes/{id}/processes"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/processes", {"command": "true"})],
    ("GET", "/v1/sandboxes/{id}/processes"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/processes")],
    ("GET", "/v1/sandboxes/{id}/processes/{pid}"): lambda w, n: [
        replace(get(f"/v1/sandboxes/{n.live}/processes/7"), control=False)],
    ("GET", "/v1/sandboxes/{id}/processes/{pid}/logs"): lambda w, n: [
        replace(get(f"/v1/sandboxes/{n.live}/processes/7/logs"), control=False)],
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/signal"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/processes/7/signal", {"signal": "SIGTERM"}, control=False)],
    ("POST", "/v1/sandboxes/{id}/processes/{pid}/wait"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/processes/7/wait", {"timeout_s": 0}, control=False)],
    ("GET", "/v1/sandboxes/{id}/display"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/display")],
    ("POST", "/v1/sandboxes/{id}/display"): lambda w, n: [send("POST", f"/v1/sandboxes/{n.live}/display", {})],
    ("GET", "/v1/screenshots/{sha}"): lambda w, n: [get(f"/v1/screenshots/{w.screenshot}"),
                                                    get(f"/v1/screenshots/{w.screenshot}?thumb=1")],
    ("GET", "/v1/sandboxes/{id}/files"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/files?path=/workspace/out.txt")],
    ("PUT", "/v1/sandboxes/{id}/files"): lambda w, n: [
        send("PUT", f"/v1/sandboxes/{n.live}/files?path=/workspace/written.txt", raw=b"x")],
    ("DELETE", "/v1/sandboxes/{id}/files"): lambda w, n: [
        send("DELETE", f"/v1/sandboxes/{n.live}/files?path=/workspace/doomed.txt")],
    ("GET", "/v1/sandboxes/{id}/files/list"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/files/list?path=/workspace")],
    ("GET", "/v1/sandboxes/{id}/files/manifest"): lambda w, n: [
        get(f"/v1/sandboxes/{n.live}/files/manifest?path=/workspace")],
    ("GET", "/v1/sandboxes/{id}/archive"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/archive?path=/workspace")],
    ("PUT", "/v1/sandboxes/{id}/archive"): lambda w, n: [
        send("PUT", f"/v1/sandboxes/{n.live}/archive?path=/workspace/untar", raw=_tar())],
    ("POST", "/v1/sandboxes/{id}/artifacts"): lambda w, n: [send("POST", f"/v1/sandboxes/{n.live}/artifacts",
                                                                 {"paths": ["out.txt"]})],
    ("GET", "/v1/sandboxes/{id}/artifacts"): both(lambda s: f"/v1/sandboxes/{s}/artifacts", stored=True),
    ("GET", "/v1/artifacts/{sandbox_id}/{path:.+}"): lambda w, n: [
        get(f"/v1/artifacts/{n.live}/{w.artifact}"), get(f"/v1/artifacts/{n.ended}/{w.artifact}", stored=True),
        get(f"/v1/artifacts/{n.ended}/{w.artifact}?redirect=1", stored=True)],
    ("POST", "/v1/sandboxes/{id}/events"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/events", {"kind": "message", "data": {"role": "user", "content": "hi"}})],
    ("GET", "/v1/sandboxes/{id}/trajectory"): lambda w, n: [get(f"/v1/sandboxes/{n.live}/trajectory")],
    ("GET", "/v1/trajectories/{sandbox_id}"): both(lambda s: f"/v1/trajectories/{s}", stored=True),
    ("GET", "/v1/runs/{run_id}/files/{name}"): lambda w, n: [get(f"/v1/runs/{n.run}/files/summary.json")],
    ("POST", "/v1/sandboxes/{id}/ports/{port}/url"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/ports/8000/url", {"expires_s": 60})],
    # Nothing listens on alpha's ports (alpha's own call is a 502): beta must get the unknown sandbox's 404.
    **{(method, "/v1/sandboxes/{id}/ports/{port}/{tail:.*}"): _unchecked(method, "/ports/8000/x")
       for method in PORT_METHODS},
    ("GET", "/v1/sandboxes/{id}/pty"): lambda w, n: [replace(get(f"/v1/sandboxes/{n.live}/pty"), control=False)],
    ("PUT", "/v1/sandboxes/{id}/mcp/{name}"): lambda w, n: [
        send("PUT", f"/v1/sandboxes/{n.live}/mcp/tools", {"port": 8000})],
    **{(method, "/v1/sandboxes/{id}/mcp/{name}"): _unchecked(method, "/mcp/tools")
       for method in ("GET", "POST", "DELETE")},
    ("DELETE", "/v1/sandboxes/{id}/mcp/{name}/publication"): _unchecked("DELETE", "/mcp/tools/publication"),
    ("GET", "/v1/sandboxes/{id}/swerex/{tail:.*}"): lambda w, n: [
        get(f"/v1/sandboxes/{n.live}/swerex/is_alive"),
        Probe("GET", f"/v1/sandboxes/{n.live}/swerex/is_alive", headers=(("X-API-Key", ""),))],
    ("POST", "/v1/sandboxes/{id}/swerex/{tail:.*}"): lambda w, n: [
        send("POST", f"/v1/sandboxes/{n.live}/swerex/execute", {"command": "true", "shell": True}),
        replace(send("POST", f"/v1/sandboxes/{n.live}/swerex/execute", {"command": "true", "shell": True}),
                headers=(("Content-Type", "application/json"), ("X-API-Key", "")))],
    # E2B's API: the control plane with the key in X-API-KEY; envd with the sandbox in E2b-Sandbox-Id.
    ("GET", "/e2b/sandboxes/{id}"): lambda w, n: [_e2b("GET", f"/e2b/sandboxes/{n.live}")],
    ("DELETE", "/e2b/sandboxes/{id}"): lambda w, n: [replace(_e2b("DELETE", f"/e2b/sandboxes/{n.live}"),
                                                             control=False)],
    # (alpha's own call would change its sandbox's lifetime, which its create's retry compares)
    ("POST", "/e2b/sandboxes/{id}/timeout"): lambda w, n: [
        replace(_e2b("POST", f"/e2b/sandboxes/{n.live}/timeout", {"timeout": 86400}), control=False)],
    ("POST", "/e2b/sandboxes/{id}/connect"): lambda w, n: [_e2b("POST", f"/e2b/sandboxes/{n.live}/connect", {})],
    ("POST", "/e2b/v2/sandboxes/{id}/connect"): lambda w, n: [
        _e2b("POST", f"/e2b/v2/sandboxes/{n.live}/connect", {})],
    ("GET", "/e2b/sandbox/health"): lambda w, n: [_envd("GET", "/e2b/sandbox/health", n.live)],
    ("GET", "/e2b/sandbox/files"): lambda w, n: [_envd("GET", "/e2b/sandbox/files?path=/workspace/out.txt", n.live)],
    ("POST", "/e2b/sandbox/files"): lambda w, n: [
        _envd("POST", "/e2b/sandbox/files?path=/workspace/e2b-probe.txt", n.live, b"x", "application/octet-stream")],
    ("POST", "/e2b/sandbox/{service}/{method}"): lambda w, n: [
        _envd("POST", "/e2b/sandbox/process.Process/List", n.live, b"{}", "application/json"),
        _envd("POST", "/e2b/sandbox/filesystem.Filesystem/Stat", n.live, b'{"path": "/workspace/out.txt"}',
              "application/json")],
    # The viewer, with beta's session.
    ("GET", "/ui/sandboxes/{id}"): both(lambda s: f"/ui/sandboxes/{s}"),
    ("GET", "/ui/trajectories/{sandbox_id}"): both(lambda s: f"/ui/trajectories/{s}", stored=True),
    ("GET", "/ui/compare"): lambda w, n: [get(f"/ui/compare?a={n.live}&b={n.ended}", stored=True)],
    ("GET", "/ui/runs/{run_id}"): lambda w, n: [get(f"/ui/runs/{n.run}")],
    ("GET", "/ui/api/sandboxes/{id}"): both(lambda s: f"/ui/api/sandboxes/{s}"),
    ("POST", "/ui/api/sandboxes/{id}/delete"): lambda w, n: [send("POST", f"/ui/api/sandboxes/{n.live}/delete",
                                                                  control=False)],
    ("GET", "/ui/api/runs/{run_id}"): lambda w, n: [get(f"/ui/api/runs/{n.run}")],
    ("GET", "/ui/api/runs/{run_id}/plots/{name}"): lambda w, n: [get(f"/ui/api/runs/{n.run}/plots/plot.png")],
    ("GET", "/ui/api/trajectories/{sandbox_id}"): _trajectory_probes(lambda w: ""),
    ("GET", "/ui/api/trajectories/{sandbox_id}/raw"): _trajectory_probes(lambda w: "/raw"),
    ("GET", "/ui/api/trajectories/{sandbox_id}/lineage"): _trajectory_probes(lambda w: "/lineage"),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}"): _trajectory_probes(lambda w: f"/steps/{w.exec_step}"),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}/file"): _trajectory_probes(
        lambda w: f"/steps/{w.file_step}/file"),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}/{stream}"): _trajectory_probes(
        lambda w: f"/steps/{w.exec_step}/stdout"),
    ("GET", "/ui/api/trajectories/{sandbox_id}/steps/{n}/{stream}/full"): _trajectory_probes(
        lambda w: f"/steps/{w.exec_step}/stdout/full"),
    # The viewer's screens: alpha's live sandbox's screen now, and the filmstrip and screenshots of its records.
    ("GET", "/ui/api/sandboxes/{id}/screen"): lambda w, n: [get(f"/ui/api/sandboxes/{n.live}/screen")],
    ("GET", "/ui/api/trajectories/{sandbox_id}/filmstrip"): _trajectory_probes(lambda w: "/filmstrip"),
    ("GET", "/ui/api/trajectories/{sandbox_id}/screenshots/{sha}"): _screenshot_probes,
}


# -- listings and creates (routes that name nothing) ------------------------------------------------------------

def _sandbox_list(w: World) -> None:
    mine = api(w, w.beta, "GET", "/v1/sandboxes")["sandboxes"]
    assert w.beta_live in {s["id"] for s in mine} and {s["project"] for s in mine} == {BETA}, mine
    assert w.names.live in {s["id"] for s in api(w, w.alpha, "GET", "/v1/sandboxes")["sandboxes"]}
    for query in ("", f"?label=task_id=alpha-task-{TAG}", f"?label=run_id=alpha-run-{TAG}", "?status=ready"):
        reply = w.router.http("GET", "/v1/sandboxes" + query, key=w.beta.key)
        assert reply.status == 200 and w.names.live not in reply.body.decode(), (query, reply.body[:300])
        names_nothing_of_alphas(w, query, reply)
    assert api(w, w.beta, "GET", f"/v1/sandboxes?label=task_id=alpha-task-{TAG}")["sandboxes"] == []


def _pool_list(w: World) -> None:
    mine = api(w, w.beta, "GET", "/v1/pools")["pools"]
    assert [(p["name"], p["project"]) for p in mine] == [(w.twin, BETA)], mine
    theirs = api(w, w.alpha, "GET", "/v1/pools")["pools"]
    assert {(p["name"], p["project"]) for p in theirs} == {(w.names.pool, ALPHA), (w.twin, ALPHA)}, theirs
    names_nothing_of_alphas(w, "", w.router.http("GET", "/v1/pools", key=w.beta.key))


def _trajectory_list(w: World) -> None:
    for query in ("", f"?task_id=alpha-task-{TAG}", f"?model=alpha-model-{TAG}", f"?harness=alpha-harness-{TAG}"):
        reply = w.router.http("GET", "/v1/trajectories" + query, key=w.beta.key)
        assert reply.status == 200, reply.body[:300]
        names_nothing_of_alphas(w, query, reply)
        if query:
            assert reply.json()["trajectories"] == [], (query, reply.body[:300])
            assert w.names.ended in json.dumps(api(w, w.alpha, "GET", "/v1/trajectories" + query)), query
    assert w.beta_ended in json.dumps(api(w, w.beta, "GET", "/v1/trajectories"))


def _artifact_list(w: World) -> None:
    for query in (f"task_id=alpha-task-{TAG}", f"run_id=alpha-run-{TAG}", f"sandbox_id={w.names.live}",
                  f"sandbox_id={w.names.ended}"):
        assert api(w, w.alpha, "GET", f"/v1/artifacts?{query}")["artifacts"], query
        reply = w.router.http("GET", f"/v1/artifacts?{query}", key=w.beta.key)
        assert reply.status == 200 and reply.json()["artifacts"] == [], (query, reply.body[:300])
        names_nothing_of_alphas(w, query, reply)
    assert api(w, w.beta, "GET", f"/v1/artifacts?task_id=beta-task-{TAG}")["artifacts"]


def _run_files_list(w: World) -> None:
    assert {f["key"] for f in api(w, w.alpha, "GET", f"/v1/runs/{w.names.run}/files")["files"]} == {
        f"runs/{w.names.run}/{name}" for name in ("summary.json", "run.json", "groups.jsonl", "plot.png")}
    reply = w.router.http("GET", f"/v1/runs/{w.names.run}/files", key=w.beta.key)
    assert reply.status == 200 and reply.json() == {"files": []}, reply.body[:300]
    assert api(w, w.beta, "GET", f"/v1/runs/{w.beta_run}/files")["files"]


def _project_list(w: World) -> None:
    assert [p["name"] for p in api(w, w.beta, "GET", "/v1/projects")["projects"]] == [BETA]
    names_nothing_of_alphas(w, "", w.router.http("GET", "/v1/projects", key=w.beta.key))


def _viewer_pages(w: World) -> None:
    for path in ("/ui/", "/ui/trajectories", f"/ui/trajectories?task_id=alpha-task-{TAG}", "/ui/runs", "/ui/compare"):
        reply = call(w, w.beta, get(path))
        assert reply.status == 200 and b"<html" in reply.body, (path, reply.status)
        names_nothing_of_alphas(w, path, reply)


def _viewer_sandboxes(w: World) -> None:
    assert w.names.live in {s["id"] for s in viewer(w, w.alpha, "/ui/api/sandboxes")["sandboxes"]}
    shown = viewer(w, w.beta, "/ui/api/sandboxes")["sandboxes"]
    assert w.beta_live in {s["id"] for s in shown} and {s["project"] for s in shown} == {BETA}, shown
    names_nothing_of_alphas(w, "", call(w, w.beta, get("/ui/api/sandboxes")))


def _viewer_runs(w: World) -> None:
    assert w.names.run in {r["run_id"] for r in viewer(w, w.alpha, "/ui/api/runs")["runs"]}
    assert [r["run_id"] for r in viewer(w, w.beta, "/ui/api/runs")["runs"]] == [w.beta_run]
    names_nothing_of_alphas(w, "", call(w, w.beta, get("/ui/api/runs")))


def _viewer_search(w: World) -> None:
    for query in ("", f"?task_id=alpha-task-{TAG}", f"?model=alpha-model-{TAG}", f"?run_id=alpha-run-{TAG}",
                  "?outcome=pass", "?date_from=2000-01-01"):
        path = "/ui/api/trajectories" + query
        assert query == "?outcome=pass" or w.names.ended in json.dumps(viewer(w, w.alpha, path)), path
        reply = call(w, w.beta, get(path))
        assert reply.status == 200, reply.body[:300]
        names_nothing_of_alphas(w, path, reply)
        found = [i["sandbox_id"] for i in reply.json()["items"]]
        assert found == ([w.beta_ended] if query in ("", "?date_from=2000-01-01") else []), (path, found)


def _create_with_alphas_request_id_and_pool(w: World) -> None:
    again = api(w, w.alpha, "POST", "/v1/sandboxes", {"request_id": f"alpha-req-{TAG}", "metadata": ALPHA_META},
                status=201)
    assert again["id"] == w.names.live, "alpha's retry no longer finds its sandbox"
    made = api(w, w.beta, "POST", "/v1/sandboxes", {"request_id": f"alpha-req-{TAG}"}, status=201)
    _beta_made(w, made)
    refused = w.router.http("POST", "/v1/sandboxes", json_body={"pool": w.names.pool}, key=w.beta.key)
    assert refused.status == 404, refused.body[:300]
    names_nothing_of_alphas(w, w.names.pool, refused)
    # beta's pool of the twin name is empty (size 0): its create starts a sandbox, never takes alpha's member.
    _beta_made(w, api(w, w.beta, "POST", "/v1/sandboxes", {"pool": w.twin}, status=201))


def _batch_with_alphas_request_id_and_pool(w: World) -> None:
    body = {"sandboxes": [{"request_id": f"alpha-req-{TAG}"}, {"pool": w.names.pool}, {"pool": w.twin}]}
    reply = w.router.http("POST", "/v1/sandboxes/batch", json_body=body, key=w.beta.key)
    assert reply.status == 200, reply.body[:300]
    first, second, third = reply.json()["sandboxes"]
    _beta_made(w, first)
    _beta_made(w, third)
    assert second["error"]["code"] == "not_found", second
    names_nothing_of_alphas(w, w.names.pool, reply)


def _beta_made(w: World, record: dict[str, Any]) -> None:
    """A sandbox beta's create made: beta's own, none of alpha's; deleted again."""
    assert record["project"] == BETA and record["id"] not in {w.names.live, w.names.member}, record
    api(w, w.beta, "DELETE", f"/v1/sandboxes/{record['id']}")


def _e2b(method: str, path: str, body: Any = None) -> Probe:
    """A call of E2B's control plane (its key in ``X-API-KEY``)."""
    data = json.dumps(body).encode() if body is not None else None
    return Probe(method, path, data, (("Content-Type", "application/json"), ("X-API-Key", "")))


def _envd(method: str, path: str, sandbox_id: str, body: bytes | None = None, kind: str | None = None) -> Probe:
    """A call of E2B's sandbox side, naming the sandbox in ``E2b-Sandbox-Id`` (the key as a bearer token)."""
    return Probe(method, path, body, (("E2b-Sandbox-Id", sandbox_id), *((("Content-Type", kind),) if kind else ())))


def _e2b_create(w: World) -> None:
    """E2B's create names a template: never alpha's pool (another project's pool name is no template of beta's)."""
    for path in ("/e2b/sandboxes", "/e2b/v2/sandboxes"):
        refused = w.router.http("POST", path, json_body={"templateID": w.names.pool}, key=w.beta.key)
        assert refused.status in (404, 422, 503), refused.body[:300]
        names_nothing_of_alphas(w, w.names.pool, refused)
        made = w.router.http("POST", path, json_body={"templateID": w.twin, "timeout": 60}, key=w.beta.key)
        assert made.status == 201, made.body[:300]
        _beta_made(w, api(w, w.beta, "GET", f"/v1/sandboxes/{made.json()['sandboxID']}"))


def _e2b_unsupported(w: World) -> None:
    """E2B calls grove lacks: the same 404 for anyone, naming nothing of alpha's."""
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        reply = w.router.http(method, f"/e2b/sandboxes/{w.names.live}/pause", key=w.beta.key)
        assert reply.status == 404 and "not supported" in reply.json()["message"], reply.body[:300]
        names_nothing_of_alphas(w, w.names.live, reply)


def _run_code(w: World) -> None:
    """SandboxFusion's run_code runs in a sandbox of beta's own (alpha's pool untouched: checked at the end)."""
    reply = w.router.http("POST", "/sandbox-fusion/run_code", json_body={"code": "print(1)", "language": "python"},
                          key=w.beta.key)
    assert reply.status == 200 and reply.json()["status"] == "Success", reply.body[:300]
    ran = reply.json()["executor_pod_name"]
    assert ran not in {w.names.live, w.names.member}
    assert api(w, w.beta, "GET", f"/v1/trajectories/{ran}")["sandbox"]["project"] == BETA
    names_nothing_of_alphas(w, "", reply)


def _pools_of_one_name(w: World) -> None:
    name = f"twin-{secrets.token_hex(3)}"
    for who in (w.alpha, w.beta):
        api(w, who, "POST", "/v1/pools", {"name": name, "size": 0}, status=201)
    try:
        api(w, w.beta, "PATCH", f"/v1/pools/{name}", {"size": 0})
        assert api(w, w.alpha, "GET", f"/v1/pools/{name}")["project"] == ALPHA
        assert api(w, w.beta, "GET", f"/v1/pools/{name}")["project"] == BETA
    finally:
        for who in (w.beta, w.alpha):
            api(w, who, "DELETE", f"/v1/pools/{name}")
    api(w, w.alpha, "GET", f"/v1/pools/{name}", status=404)


def _run_file_written(w: World) -> None:
    path = f"/v1/runs/{w.names.run}/files/summary.json"
    theirs = w.router.http("GET", path, key=w.alpha.key).body
    reply = w.router.http("PUT", path, b'{"by": "beta"}', key=w.beta.key)
    assert reply.status == 201, reply.body[:300]
    assert w.router.http("GET", path, key=w.alpha.key).body == theirs
    assert w.router.http("GET", path, key=w.beta.key).body == b'{"by": "beta"}'


def _storage_report(w: World) -> None:
    assert [p["project"] for p in api(w, w.alpha, "GET", "/v1/storage")["projects"]] == [ALPHA]
    reply = w.router.http("GET", "/v1/storage", key=w.beta.key)
    assert reply.status == 200 and [p["project"] for p in reply.json()["projects"]] == [BETA], reply.body[:300]
    names_nothing_of_alphas(w, "", reply)


def _storage_gc(w: World) -> None:
    reply = w.router.http("POST", "/v1/storage/gc", json_body={"dry_run": True}, key=w.beta.key)
    assert reply.status == 200 and [p["project"] for p in reply.json()["projects"]] == [BETA], reply.body[:300]
    names_nothing_of_alphas(w, "", reply)


def _images_are_the_routers(w: World) -> None:
    # Images are the backend's, shared by every project (no project owns one): both see the same answers.
    for name in ("default", f"no-such-image-{TAG}"):
        mine, theirs = (w.router.http("GET", f"/v1/images/{name}", key=who.key) for who in (w.alpha, w.beta))
        assert (mine.status, mine.body) == (theirs.status, theirs.body), name


def _derived_images_are_the_routers(w: World) -> None:
    # A new name for an image's layers: images are the router's, so both get the same answer.
    body = {"source": f"no-such-image-{TAG}"}
    mine, theirs = (w.router.http("POST", f"/v1/images/derived-{TAG}", json_body=body, key=who.key)
                    for who in (w.alpha, w.beta))
    assert mine.status == theirs.status == 404 and mine.body == theirs.body, (mine.body, theirs.body)


def _builds_are_the_callers(w: World) -> None:
    # A build names nothing of alpha's: its steps are sandboxes of the caller's project (quotas tested in
    # tests/images/test_build_endpoint.py), its image the router's; a context without its Dockerfile is the
    # same 400 for both, naming nothing of alpha's.
    mine, theirs = (w.router.http("POST", f"/v1/images/build?tag=built-{TAG}", _tar(), key=who.key,
                                  headers={"Content-Type": "application/x-tar"}) for who in (w.alpha, w.beta))
    assert mine.status == theirs.status == 400 and mine.body == theirs.body, (mine.body, theirs.body)
    names_nothing_of_alphas(w, "", theirs)


# Routes that name nothing of alpha's: what beta must (and must not) get from them.
CHECKS: dict[tuple[str, str], Callable[[World], None]] = {
    ("GET", "/v1/sandboxes"): _sandbox_list,
    ("GET", "/v1/pools"): _pool_list,
    ("GET", "/v1/trajectories"): _trajectory_list,
    ("GET", "/v1/artifacts"): _artifact_list,
    ("GET", "/v1/runs/{run_id}/files"): _run_files_list,
    ("GET", "/v1/projects"): _project_list,
    ("GET", "/v1/images/{name:.+}"): _images_are_the_routers,
    ("POST", "/v1/images/{name:.+}"): _derived_images_are_the_routers,
    ("POST", "/v1/images/build"): _builds_are_the_callers,
    ("GET", "/v1/storage"): _storage_report,
    ("POST", "/v1/storage/gc"): _storage_gc,
    ("GET", "/ui/"): _viewer_pages,
    ("GET", "/ui/trajectories"): _viewer_pages,
    ("GET", "/ui/runs"): _viewer_pages,
    ("GET", "/ui/api/sandboxes"): _viewer_sandboxes,
    ("GET", "/ui/api/runs"): _viewer_runs,
    ("GET", "/ui/api/trajectories"): _viewer_search,
    ("POST", "/v1/sandboxes"): _create_with_alphas_request_id_and_pool,
    ("POST", "/v1/sandboxes/batch"): _batch_with_alphas_request_id_and_pool,
    ("POST", "/v1/pools"): _pools_of_one_name,
    ("PUT", "/v1/runs/{run_id}/files/{name}"): _run_file_written,
    ("POST", "/e2b/sandboxes"): _e2b_create,
    ("POST", "/e2b/v2/sandboxes"): _e2b_create,
    **{(method, "/e2b/{tail:.*}"): _e2b_unsupported for method in ("GET", "POST", "PUT", "PATCH", "DELETE")},
    ("POST", "/sandbox-fusion/run_code"): _run_code,
}
WRITES = {("POST", "/e2b/sandboxes"), ("POST", "/e2b/v2/sandboxes"), ("POST", "/sandbox-fusion/run_code"),
          ("POST", "/v1/sandboxes"), ("POST", "/v1/sandboxes/batch"), ("POST", "/v1/pools"),
          ("PUT", "/v1/runs/{run_id}/files/{name}")}
"""Checks that leave beta with things named as alpha's are (a run file under alpha's run id, a sandbox made with
alpha's request id): they run after the listings, which would show them as beta's own."""
NO_SESSION = {("GET", "/ui"), ("GET", "/ui/login"), ("POST", "/ui/login"), ("POST", "/ui/logout"),
              ("GET", "/ui/static/{name}")}
"""The viewer's routes without a session: the redirect to /ui/, the login form and its post, the logout, the
viewer's own scripts and styles. None reads anything of a project, so there is nothing of alpha's to ask for."""


def route_ids() -> list[tuple[str, str]]:
    """Every route of the API and of the viewer as (method, path), the :data:`WRITES` last."""
    every = [(r.method, r.path) for r in ROUTES] + [(m, p) for m, p, _ in UI_ROUTES]
    return sorted(every, key=lambda route: route in WRITES)
