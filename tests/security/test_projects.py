"""Projects on one real router: the member keys of two projects (alpha, beta) and the operator's admin key.

beta is the attacker. Every route of the API (:data:`router.api.routes.ROUTES`) and of the viewer
(:data:`router.ui.UI_ROUTES`) is one case of ``test_every_route``, parametrized from those tables, so a route
added without a case in :mod:`tests.security.project_routes` fails. A route that names something (a sandbox, a
pool, a run, a project) is called with alpha's real ids and names: first by alpha (the URL is real, the call
succeeds), then by beta, which gets a 404 naming nothing of alpha's, byte for byte what the same route answers
beta for ids that never existed (so not even whether alpha's exist leaks). A listing shows beta only its own; a
create lands in beta's own project. The stored things are checked again once the router has forgotten the
deleted sandbox (a restart): then only the project's part of the bucket can answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from router.api.routes import ROUTES
from router.ui import UI_ROUTES
from tests.security.project_routes import CASES, CHECKS, NO_SESSION, route_ids
from tests.support.project_world import (
    ALPHA,
    BETA,
    PROJECT,
    TAG,
    World,
    api,
    call,
    cleanup,
    get,
    logged_in,
    make_world,
    names_nothing_of_alphas,
    refused_as_unknown,
    viewer,
)
from tests.support.router_fixtures import RouterProcess, wait_for


@pytest.fixture(scope="module")
def world(router: RouterProcess) -> Iterator[World]:
    try:
        yield make_world(router)
    finally:
        if not router.alive():
            router.start()
        cleanup(router)


@pytest.mark.parametrize("route", route_ids(), ids=lambda route: f"{route[0]} {route[1]}")
def test_every_route(world: World, route: tuple[str, str]) -> None:
    spec = next((r for r in ROUTES if (r.method, r.path) == route), None)
    if spec is not None and spec.public:
        return  # /healthz and the OpenAPI document: no key, nothing of a project's
    if spec is not None and spec.own_auth:
        # The executors' snapshot upload: its credential is a sandbox's upload token, never an API key, so no
        # project's key reaches it (beta's is simply not a credential there).
        reply = world.router.http("POST", route[1].replace("{id}", world.names.live), b"{}", key=world.beta.key,
                                  headers={"Content-Type": "application/json"})
        assert reply.status in (401, 404), reply.body[:300]
        names_nothing_of_alphas(world, world.names.live, reply)
        return
    if route in NO_SESSION:
        return
    if route in CHECKS:
        CHECKS[route](world)
        return
    assert route in CASES, f"{route[0]} {route[1]} has no case here: add what beta must get from it"
    refused_as_unknown(world, CASES[route], world.names)


def test_no_case_is_left_over() -> None:
    """Every case names a route that is served (a renamed route leaves no case testing nothing)."""
    every = {(r.method, r.path) for r in ROUTES} | {(m, p) for m, p, _ in UI_ROUTES}
    assert set(CASES) | set(CHECKS) | NO_SESSION <= every, sorted((set(CASES) | set(CHECKS) | NO_SESSION) - every)
    assert not set(CASES) & set(CHECKS)


def test_alphas_things_are_untouched(world: World) -> None:
    """After every attempt of beta's (deletes among them): alpha's sandbox, files, pool and run are as they were."""
    w = world
    assert api(w, w.alpha, "GET", f"/v1/sandboxes/{w.names.live}")["status"] == "ready"
    assert w.router.http("GET", f"/v1/sandboxes/{w.names.live}/files?path=/workspace/out.txt",
                         key=w.alpha.key).body == f"alpha-secret-{TAG}\n".encode()
    pool = api(w, w.alpha, "GET", f"/v1/pools/{w.names.pool}")
    assert (pool["size"], pool["ready"], pool["claims"]) == (1, 1, 0), pool
    assert api(w, w.alpha, "GET", f"/v1/trajectories/{w.names.ended}")["sandbox"]["id"] == w.names.ended


def test_a_member_may_not_name_another_project(world: World) -> None:
    w = world
    paths = ("/v1/sandboxes", "/v1/pools", "/v1/trajectories", f"/v1/artifacts?task_id=alpha-task-{TAG}",
             f"/v1/runs/{w.names.run}/files", "/v1/projects", "/v1/storage")
    for named in (ALPHA, "*"):
        calls = [w.router.http("GET", path, headers={PROJECT: named}, key=w.beta.key) for path in paths]
        calls.append(w.router.http("POST", "/v1/sandboxes", json_body={}, headers={PROJECT: named}, key=w.beta.key))
        for path, reply in zip([*paths, "POST /v1/sandboxes"], calls, strict=True):
            assert reply.status == 403, (named, path, reply.status, reply.body[:300])
            names_nothing_of_alphas(w, path, reply)
    assert api(w, w.beta, "GET", "/v1/sandboxes", headers={PROJECT: BETA})["sandboxes"]  # its own: fine


def test_the_admin_sees_both_and_acts_in_either(world: World) -> None:
    w = world
    everyone = {s["id"]: s["project"] for s in api(w, w.admin, "GET", "/v1/sandboxes",
                                                   headers={PROJECT: "*"})["sandboxes"]}
    assert everyone.get(w.names.live) == ALPHA and everyone.get(w.beta_live) == BETA, everyone
    only_alpha = {s["id"] for s in api(w, w.admin, "GET", "/v1/sandboxes", headers={PROJECT: ALPHA})["sandboxes"]}
    assert w.names.live in only_alpha and w.beta_live not in only_alpha
    assert w.names.live not in {s["id"] for s in api(w, w.admin, "GET", "/v1/sandboxes")["sandboxes"]}
    pools = {(p["name"], p["project"]) for p in api(w, w.admin, "GET", "/v1/pools", headers={PROJECT: "*"})["pools"]}
    assert {(w.twin, ALPHA), (w.twin, BETA), (w.names.pool, ALPHA)} <= pools, pools
    assert {p["name"] for p in api(w, w.admin, "GET", "/v1/projects", headers={PROJECT: "*"})["projects"]} >= {
        ALPHA, BETA}
    # Acting in alpha: its stored record, its run, and a sandbox made there, which alpha's key then sees.
    assert w.names.ended in json.dumps(api(w, w.admin, "GET", f"/v1/trajectories?task_id=alpha-task-{TAG}",
                                           headers={PROJECT: ALPHA}))
    assert api(w, w.admin, "GET", f"/v1/trajectories/{w.names.live}")["sandbox"]["project"] == ALPHA
    summary = w.router.http("GET", f"/v1/runs/{w.names.run}/files/summary.json", headers={PROJECT: ALPHA})
    assert f"alpha-summary-{TAG}".encode() in summary.body
    made = api(w, w.admin, "POST", "/v1/sandboxes", {}, status=201, headers={PROJECT: ALPHA})
    try:
        assert made["project"] == ALPHA
        assert made["id"] in {s["id"] for s in api(w, w.alpha, "GET", "/v1/sandboxes")["sandboxes"]}
        api(w, w.beta, "GET", f"/v1/sandboxes/{made['id']}", status=404)
    finally:
        api(w, w.admin, "DELETE", f"/v1/sandboxes/{made['id']}")


def test_a_revoked_key_stops_at_once(world: World) -> None:
    w = world
    added = w.router.cli("key", "add", "beta-temp", "--project", BETA)
    assert added.returncode == 0, added.stderr
    key = added.stdout.decode().strip()
    wait_for(lambda: w.router.http("GET", "/v1/sandboxes", key=key).status == 200, 5, what="the new key")
    temp = logged_in(w.router, key)
    assert call(w, temp, get("/ui/api/sandboxes")).status == 200
    fingerprint = [line.split()[0] for line in w.router.cli("key", "ls").stdout.decode().splitlines()
                   if "beta-temp" in line]
    assert len(fingerprint) == 1, fingerprint
    done = w.router.cli("key", "revoke", fingerprint[0])
    assert done.returncode == 0, done.stderr
    wait_for(lambda: w.router.http("GET", "/v1/sandboxes", key=temp.key).status == 401, 2.5, interval=0.05,
             what="the revoked key refused")
    assert call(w, temp, get("/ui/api/sandboxes")).status == 401
    assert call(w, temp, get(f"/ui/trajectories/{w.beta_ended}")).status in (303, 401)


def test_a_forgotten_sandbox_is_looked_for_only_in_the_callers_project(world: World) -> None:
    """After a restart the router no longer knows alpha's deleted sandbox: what is stored of it (its record,
    artifacts, full outputs) is then found only through alpha's own part of the bucket."""
    w = world
    w.router.stop()
    w.router.start()
    w.alpha, w.beta = logged_in(w.router, w.alpha.key), logged_in(w.router, w.beta.key)
    reply = w.router.http("GET", f"/v1/sandboxes/{w.names.ended}", key=w.alpha.key)
    assert reply.status == 404, "the router still knows the deleted sandbox: this test checks nothing"
    # alpha reads its record first, so the viewer's cache holds it when beta asks.
    viewer(w, w.alpha, f"/ui/api/trajectories/{w.names.ended}")
    ran = 0
    for build in CASES.values():
        if any(p.stored for p in build(w, w.names)):
            refused_as_unknown(w, build, w.names, stored_only=True)
            ran += 1
    assert ran >= 8, ran
