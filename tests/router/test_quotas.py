"""Quotas and admission (issue 32): a project's quotas refuse with 429 naming the quota and recover; one
project's burst does not stall another's creates; the host's memory admits a burst as far as it has room — a
create short only of the room promised to starts in flight waits for them, while one over its project's quota is
refused at once — and refuses the rest whole (nothing half-started)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from grove.client import AsyncGrove
from grove.errors import QuotaExceeded
from router.lifecycle.admission import HOST_WAIT_S, START_MEMORY_MB, read_host
from tests.support.router_fixtures import RouterProcess, router_state, starts_held, wait_for

pytestmark = pytest.mark.local_only

SMALL = {"cpu": 0.25, "memory_mb": 256, "disk_mb": 256}
ROOM_MB = 1500
"""What a tight host has to spare above its reserve: each create is counted at 64 MiB while it starts, so ~23 may
start at once."""
BURST = 60
"""A burst larger than a tight host can start at once: the creates past ~23 wait for the starts before them."""


def _key(router: RouterProcess, project: str) -> str:
    """A new member key of ``project``, once the router takes it (it re-reads the key file at most once a second)."""
    return router.member_key(project, f"{project}-user")


def _project(router: RouterProcess, verb: str, name: str, *flags: str) -> None:
    done = router.cli("project", verb, name, *flags)
    assert done.returncode == 0, done.stderr.decode()


def _create(router: RouterProcess, key: str, **body: Any) -> Any:
    return router.http("POST", "/v1/sandboxes", json_body={**SMALL, **body}, key=key)


@pytest.fixture(scope="module")
def quota_router(s3_server: Any) -> Iterator[RouterProcess]:
    with router_state(s3=s3_server) as router:
        yield router


@pytest.fixture
def tight_router(s3_server: Any) -> Iterator[RouterProcess]:
    """A router of its own whose host keeps all but :data:`ROOM_MB` of the memory available now."""
    reserve = read_host(Path("/")).memory_available_mb - ROOM_MB
    with router_state(s3=s3_server, up_args=("--memory-reserve-mb", str(int(reserve)))) as router:
        yield router


@pytest.fixture
def alpha(quota_router: RouterProcess) -> Iterator[str]:
    """A member key of a project of its own for each test (project names are unique per test)."""
    key = _key(quota_router, "alpha")
    yield key
    quota_router.delete_all()
    quota_router.cli("project", "set", "alpha", "--sandboxes", "none", "--starting", "none", "--memory-mb", "none",
                     "--cpu", "none")


def test_a_quota_refuses_with_429_naming_it_and_recovers(quota_router: RouterProcess, alpha: str) -> None:
    _project(quota_router, "set", "alpha", "--sandboxes", "2")
    time.sleep(1.2)  # the router re-reads project definitions at most once a second
    made = [_create(quota_router, alpha) for _ in range(2)]
    assert [r.status for r in made] == [201, 201], [r.body[:300] for r in made]
    refused = _create(quota_router, alpha)
    assert refused.status == 429, refused.body[:300]
    assert refused.json()["error"]["code"] == "quota_exceeded"
    message = refused.json()["error"]["message"]
    assert "'sandboxes' quota" in message and "holds 2 of 2" in message, message
    assert int(refused.headers["Retry-After"]) >= 1
    # Nothing of the refused create exists: the project still holds exactly two.
    listed = quota_router.http("GET", "/v1/sandboxes", key=alpha).json()["sandboxes"]
    assert len(listed) == 2
    # The SDK raises it as its own class, a kind of Unavailable (a runner waits it out like back-pressure).
    with quota_router.client(alpha) as grove, pytest.raises(QuotaExceeded, match="'sandboxes' quota"):
        grove.request("POST", "/v1/sandboxes", json_body=SMALL)
    # Recovers: one gone, one more fits; and a raised quota holds within a second, without a restart.
    assert quota_router.http("DELETE", f"/v1/sandboxes/{listed[0]['id']}", key=alpha).status == 200
    assert _create(quota_router, alpha).status == 201
    assert _create(quota_router, alpha).status == 429
    _project(quota_router, "set", "alpha", "--sandboxes", "3")
    wait_for(lambda: _create(quota_router, alpha).status == 201, 5, interval=0.3, what="the raised quota")


def test_reserved_memory_and_starting_quotas(quota_router: RouterProcess, alpha: str) -> None:
    _project(quota_router, "set", "alpha", "--memory-mb", "600", "--starting", "1")
    time.sleep(1.2)
    first = _create(quota_router, alpha, wait=False)
    assert first.status == 201, first.body[:300]
    # The first is still starting (wait=false answers at once): a second may not start beside it.
    second = _create(quota_router, alpha, wait=False)
    assert second.status == 429 and "'starting' quota" in second.json()["error"]["message"], second.body[:300]
    wait_for(lambda: quota_router.http("GET", f"/v1/sandboxes/{first.json()['id']}", key=alpha).json()["status"]
             == "ready", 60, what="the first start")
    assert _create(quota_router, alpha).status == 201  # 512 MiB of 600 reserved now
    third = _create(quota_router, alpha)
    assert third.status == 429, third.body[:300]
    message = third.json()["error"]["message"]
    assert "'memory_mb' quota" in message and "512 MiB of 600 MiB" in message, message
    # Another project is not held to alpha's quotas.
    beta = _key(quota_router, "beta")
    assert _create(quota_router, beta).status == 201


def test_a_pool_fills_only_within_its_projects_quota(quota_router: RouterProcess, alpha: str) -> None:
    _project(quota_router, "set", "alpha", "--sandboxes", "2")
    time.sleep(1.2)
    too_big = quota_router.http("POST", "/v1/pools", json_body={"name": "p", "size": 3, "resources": SMALL},
                                key=alpha)
    assert too_big.status == 422 and "quota of 2 sandboxes" in too_big.json()["error"]["message"], too_big.body
    made = quota_router.http("POST", "/v1/pools", json_body={"name": "p", "size": 2, "resources": SMALL}, key=alpha)
    assert made.status == 201, made.body[:300]
    wait_for(lambda: quota_router.http("GET", "/v1/pools/p", key=alpha).json()["ready"] == 2, 60, what="the pool")
    # Its members are the project's two sandboxes: a create that claims none is refused...
    other = _create(quota_router, alpha, memory_mb=300)
    assert other.status == 429, other.body[:300]
    # ... a claim is not (a member becomes the claimant's), and the filler does not refill past the quota.
    claimed = _create(quota_router, alpha, pool="p")
    assert claimed.status == 201, claimed.body[:300]
    wait_for(lambda: "not filling" in (quota_router.http("GET", "/v1/pools/p", key=alpha).json()["error"] or ""), 15,
             what="the pool saying why it does not refill")
    assert quota_router.http("GET", "/v1/pools/p", key=alpha).json()["ready"] == 1


def test_project_ls_shows_use_against_quota(quota_router: RouterProcess, alpha: str) -> None:
    _project(quota_router, "set", "alpha", "--sandboxes", "5", "--memory-mb", "2048", "--retention-days", "30")
    assert _create(quota_router, alpha).status == 201
    time.sleep(1.2)
    done = quota_router.cli("project", "ls")
    assert done.returncode == 0, done.stderr.decode()
    row = next(line for line in done.stdout.decode().splitlines() if line.startswith("alpha "))
    assert "1/5" in row and "256/2048" in row and "30 d" in row, row
    mine = quota_router.http("GET", "/v1/projects", key=alpha).json()["projects"]
    assert [p["name"] for p in mine] == ["alpha"] and mine[0]["usage"]["sandboxes"] == 1
    assert quota_router.http("GET", "/v1/projects/default", key=alpha).status == 404


def test_one_projects_burst_does_not_stall_anothers_create(quota_router: RouterProcess, alpha: str) -> None:
    """The host starts a few sandboxes at once; starts are handed out round-robin between projects, so beta's
    one create waits for at most one of alpha's starts, not for alpha's whole burst in front of it."""
    beta = _key(quota_router, "beta")

    async def burst() -> tuple[float, float]:
        async with AsyncGrove(quota_router.url, alpha) as a, AsyncGrove(quota_router.url, beta) as b:
            began = time.monotonic()
            # 80: a burst long enough that the start or two beta waits for stays a small part of it on a loaded
            # host too (with 40, a CI run saw 0.29 of it; on a quiet host 80 gives 0.06-0.10).
            alpha_task = asyncio.create_task(a.request("POST", "/v1/sandboxes/batch", json_body={
                "template": {**SMALL, "memory_mb": 64}, "request_ids": [f"burst-{i}" for i in range(80)]}))
            await asyncio.sleep(0.3)  # alpha's burst is queued in front
            asked = time.monotonic()
            await b.request("POST", "/v1/sandboxes", json_body=SMALL)
            beta_s = time.monotonic() - asked
            answer = await alpha_task
            assert all("id" in s for s in answer["sandboxes"]), answer
            return beta_s, time.monotonic() - began

    beta_s, burst_s = asyncio.run(burst())
    # Stated bound: beta's create takes under a quarter of the burst's time (first come, first served: all of it).
    assert beta_s < 0.25 * burst_s, (beta_s, burst_s)


def test_a_burst_larger_than_can_start_at_once_waits_for_the_starts_before_it(tight_router: RouterProcess) -> None:
    """A tight host and a burst of 60 creates: the creates past those that may start at once wait for the starts
    before them rather than failing, so more sandboxes are made than could start at once (all 60, unless the
    shared host's memory falls meanwhile); any refused one is a 503 naming memory; every one made is ready and
    nothing is left of a refused one."""
    router = tight_router
    answer = router.http("POST", "/v1/sandboxes/batch", json_body={
        "template": {**SMALL, "memory_mb": 256}, "request_ids": [f"mem-{i}" for i in range(BURST)]},
        timeout=300).json()
    made = [s for s in answer["sandboxes"] if "id" in s]
    refused = [s["error"] for s in answer["sandboxes"] if "id" not in s]
    assert len(made) > ROOM_MB // START_MEMORY_MB, (len(made), refused[:2])  # more than could start at once
    assert all(e["code"] == "unavailable" and "short of memory" in e["message"] and e.get("retry_after")
               for e in refused), refused[:2]
    assert all(s["status"] == "ready" for s in made), made
    assert router.live_ids() == {s["id"] for s in made}  # nothing of the refused ones was made
    router.delete_all()
    again = router.http("POST", "/v1/sandboxes", json_body={**SMALL, "memory_mb": 256})
    assert again.status == 201, again.body[:300]


async def _until(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 30.0) -> Any:
    """Poll ``check`` until it returns something truthy, and return that (:func:`wait_for`, in a running loop)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (value := await check()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {value!r})")
        await asyncio.sleep(0.1)
    return value


async def _usage(client: AsyncGrove, project: str) -> dict[str, Any]:
    """What the router shows ``project`` holding, starting and waiting for (``GET /v1/projects/{name}``)."""
    usage: dict[str, Any] = (await client.request("GET", f"/v1/projects/{project}"))["usage"]
    return usage


@dataclass
class _Burst:
    """Creates of a project sent while the router's starts are held."""

    tasks: list[asyncio.Task[Any]]
    """Each create's request (``wait: false``: each answers once admitted, before its start)."""
    release: Callable[[], None]
    """Let the router's starts go on (a no-op once done)."""


@contextlib.asynccontextmanager
async def _held_burst(router: RouterProcess, client: AsyncGrove, project: str) -> AsyncIterator[_Burst]:
    """:data:`BURST` creates of ``project`` on a tight host whose starts are held (:func:`starts_held`), yielded once
    the router shows some of them waiting for the host's room, the others admitted with their starts in flight
    (none of which can end until released). However the block ends, the starts are released, and it is left only
    once the router shows no create of any project waiting or starting: nothing of the test's is started after
    its cleanup has deleted the sandboxes."""
    with contextlib.ExitStack() as hold:
        hold.enter_context(starts_held(router))
        tasks = [asyncio.create_task(client.request("POST", "/v1/sandboxes", json_body={**SMALL, "wait": False}))
                 for _ in range(BURST)]

        async def waiting() -> dict[str, Any] | None:
            refused = [t.exception() for t in tasks if t.done() and t.exception() is not None]
            assert not refused, refused[:1]  # e.g. the shared host's memory fell below the reserve meanwhile
            usage = await _usage(client, project)
            return usage if usage["waiting"] > 0 and usage["starting"] > 0 else None

        async def settled() -> bool:
            async with AsyncGrove(router.url, router.key, project="*") as admin:  # every project's creates
                shown = (await admin.request("GET", "/v1/projects"))["projects"]
            return all(p["usage"]["waiting"] == 0 and p["usage"]["starting"] == 0 for p in shown)

        try:
            await _until(waiting, f"{project}'s creates past those the host's room admits waiting for it")
            yield _Burst(tasks, hold.close)
        finally:
            hold.close()
            for task in tasks:
                task.cancel()  # only those a failed test left unanswered
            await asyncio.gather(*tasks, return_exceptions=True)
            await _until(settled, "the router done with every create", timeout_s=HOST_WAIT_S + 120)


async def _all_ready(client: AsyncGrove, count: int) -> list[dict[str, Any]]:
    """The client's project's sandboxes, once there are ``count`` and every one is ready."""
    async def ready() -> list[dict[str, Any]] | None:
        listed: list[dict[str, Any]] = (await client.request("GET", "/v1/sandboxes"))["sandboxes"]
        if any(s["status"] == "failed" for s in listed):
            raise AssertionError(f"a start failed: {[s for s in listed if s['status'] == 'failed'][:1]}")
        return listed if len(listed) == count and all(s["status"] == "ready" for s in listed) else None

    found: list[dict[str, Any]] = await _until(ready, f"{count} sandboxes ready", timeout_s=240)
    return found


def test_a_create_over_its_quota_is_refused_at_once_while_the_hosts_room_is_held(
        tight_router: RouterProcess) -> None:
    """Project alpha holds its quota of one sandbox while beta's burst holds a tight host's room with starts in
    flight (held: the router's zygote is stopped, so none can end) and the rest of the burst waits for it. alpha's
    next create is a 429 naming the quota while all that is still so: no start of beta's ended, none more was
    admitted, some still wait. (Before, it waited in alpha's line until a start ended or :data:`HOST_WAIT_S`
    passed: it is sent with a client timeout of half that.) Then every one of beta's creates ends ready, and
    alpha still holds its one sandbox."""
    router = tight_router
    _project(router, "create", "alpha", "--sandboxes", "1")
    alpha, beta = _key(router, "alpha"), _key(router, "beta")
    assert _create(router, alpha).status == 201  # alpha is full (and the router's zygote runs from now on)

    async def refused_while_held() -> None:
        async with AsyncGrove(router.url, beta) as b, \
                AsyncGrove(router.url, alpha, timeout_s=HOST_WAIT_S / 2) as a, \
                _held_burst(router, b, "beta") as burst:
            before = await _usage(b, "beta")
            with pytest.raises(QuotaExceeded) as refused:
                await a.request("POST", "/v1/sandboxes", json_body=SMALL)
            after = await _usage(b, "beta")
            unanswered = sum(not t.done() for t in burst.tasks)
            listed = (await b.request("GET", "/v1/sandboxes"))["sandboxes"]
            burst.release()
            message = refused.value.message
            assert "'sandboxes' quota" in message and "holds 1 of 1" in message, message
            assert refused.value.retry_after is not None and refused.value.retry_after >= 1
            # The 429 came while beta's starts were all still in flight and the rest of its burst still waited.
            assert after["starting"] == before["starting"] > 0, (before, after)
            assert after["waiting"] > 0 and unanswered >= after["waiting"], (after, unanswered)
            assert {s["status"] for s in listed} == {"pending"}, listed[:2]
            # Nothing else disturbed: every one of beta's creates is admitted and ends ready once starts go on.
            answers = await asyncio.gather(*burst.tasks)
            assert all(answer["status"] == "pending" for answer in answers), answers[:2]
            assert {s["id"] for s in await _all_ready(b, BURST)} == {answer["id"] for answer in answers}
            shown = await _usage(a, "alpha")
            assert shown["sandboxes"] == 1 and shown["starting"] == shown["waiting"] == 0, shown  # nothing left

    asyncio.run(refused_while_held())


def test_a_create_within_its_quota_still_waits_for_the_hosts_room_and_is_admitted(
        tight_router: RouterProcess) -> None:
    """The same held burst of beta's, and alpha with room in its quota (one sandbox of two): alpha's create waits
    for the host's room in alpha's line (the router shows it waiting, not starting), and once the starts go on
    it is admitted and ends ready beside all of beta's."""
    router = tight_router
    _project(router, "create", "alpha", "--sandboxes", "2")
    alpha, beta = _key(router, "alpha"), _key(router, "beta")
    assert _create(router, alpha).status == 201  # the router's zygote runs from now on

    async def alpha_waiting(client: AsyncGrove) -> dict[str, Any] | None:
        usage = await _usage(client, "alpha")
        return usage if usage["waiting"] == 1 else None

    async def waits_then_admitted() -> None:
        async with AsyncGrove(router.url, beta) as b, AsyncGrove(router.url, alpha) as a, \
                _held_burst(router, b, "beta") as burst:
            mine = asyncio.create_task(a.request("POST", "/v1/sandboxes", json_body={**SMALL, "wait": False}))
            try:
                shown = await _until(lambda: alpha_waiting(a), "alpha's create waiting for the host's room")
                assert shown["starting"] == 0 and shown["sandboxes"] == 1 and not mine.done(), shown
                listed = router.cli("project", "ls")  # what a person sees: its WAITING column
                assert listed.returncode == 0, listed.stderr.decode()
                header, *rows = listed.stdout.decode().splitlines()
                row = next(line for line in rows if line.startswith("alpha "))
                assert header.split()[3] == "WAITING" and row.split()[1:4] == ["1/2", "0/-", "1"], (header, row)
                burst.release()
                made = await mine
            finally:
                mine.cancel()  # only if the test failed before its answer
            answers = await asyncio.gather(*burst.tasks)
            assert made["id"] in {s["id"] for s in await _all_ready(a, 2)}
            assert len(await _all_ready(b, BURST)) == len(answers)

    asyncio.run(waits_then_admitted())


def test_a_host_short_of_memory_with_nothing_starting_refuses_at_once(s3_server: Any) -> None:
    """A host already past its reserve, with no start in flight to wait for: each create of a burst is a 503
    naming memory and the reserve, with a ``Retry-After``, at once (not after the wait for starts), and
    nothing of it is made."""
    reserve = read_host(Path("/")).memory_available_mb + 512
    with router_state(s3=s3_server, up_args=("--memory-reserve-mb", str(int(reserve)))) as router:
        began = time.monotonic()
        answer = router.http("POST", "/v1/sandboxes/batch", json_body={
            "template": SMALL, "request_ids": [f"short-{i}" for i in range(5)]}, timeout=120).json()
        took = time.monotonic() - began
        errors = [s.get("error") for s in answer["sandboxes"]]
        assert all(e is not None and e["code"] == "unavailable" and "short of memory" in e["message"]
                   and "--memory-reserve-mb" in e["message"] and e.get("retry_after") for e in errors), errors
        assert took < HOST_WAIT_S, took  # refused at once: nothing was starting, so nothing to wait for
        assert router.live_ids() == set()


def test_a_burst_of_desktops_is_counted_at_a_desktops_memory(s3_server: Any) -> None:
    """A desktop is counted at 400 MiB while it starts (a coding sandbox at 64): with ~1 GiB to spare, a burst of
    ten desktops whose screen and browser start with them gets a few (two start at once; more only as far as
    the first leave room once running) and 503s naming memory for the rest, where ten coding sandboxes
    all fit. (A desktop whose screen starts at its first action holds a coding sandbox's memory when ready, and
    the host's room is checked at create only.)"""
    reserve = read_host(Path("/")).memory_available_mb - 1000
    with router_state(s3=s3_server, up_args=("--memory-reserve-mb", str(int(reserve)))) as router:
        desktops = router.http("POST", "/v1/sandboxes/batch", json_body={
            "template": {**SMALL, "memory_mb": 2048, "desktop": {"start": True, "browser": "about:blank"}},
            "request_ids": [f"d-{i}" for i in range(10)]},
            timeout=300).json()["sandboxes"]
        made = [s for s in desktops if "id" in s]
        refused = [s["error"] for s in desktops if "id" not in s]
        # Two start at once; how many more fit depends on what each browser holds once up (~200-350 MiB) and on the
        # shared host's memory meanwhile: some, never all ten.
        assert 1 <= len(made) <= 8 and len(refused) >= 2, (len(made), refused[:1])
        assert all("short of memory" in e["message"] for e in refused), refused[:1]
        router.delete_all()
        coding = router.http("POST", "/v1/sandboxes/batch", json_body={
            "template": {**SMALL, "memory_mb": 2048}, "request_ids": [f"c-{i}" for i in range(10)]}).json()
        assert all("id" in s for s in coding["sandboxes"]), [s.get("error") for s in coding["sandboxes"]][:2]
        router.delete_all()


def test_the_host_admits_creates_only_while_the_state_disk_keeps_its_reserve(s3_server: Any) -> None:
    """A state dir on a 96 MiB tmpfs (the runtime takes ~61 MiB of it) under the default reserve (at least
    2 GiB kept free): every create is a 503 naming disk and the state dir, and nothing of it is made; with
    ``--disk-reserve-mb 8`` the same disk admits one."""
    with router_state(s3=s3_server, disk_mb=96) as router:
        refused = router.http("POST", "/v1/sandboxes", json_body=SMALL)
        assert refused.status == 503 and int(refused.headers["Retry-After"]) >= 1, refused.body[:300]
        message = refused.json()["error"]["message"]
        assert "short of disk" in message and str(router.state_dir) in message, message
        assert "--disk-reserve-mb" in message, message
        assert router.live_ids() == set() and not list((router.state_dir / "sandboxes").iterdir())
        router.stop()
        router.up_args += ("--disk-reserve-mb", "8")
        router.start()
        admitted = router.http("POST", "/v1/sandboxes", json_body=SMALL)
        assert admitted.status == 201, admitted.body[:300]
        router.delete_all()


def test_a_project_past_its_stored_bytes_creates_no_more(quota_router: RouterProcess) -> None:
    """What a project keeps in object storage counts too: past its ``stored_bytes`` a create is a 429 saying how
    to free space; another project is not held to it."""
    key = _key(quota_router, "keeper")
    _project(quota_router, "set", "keeper", "--stored-gb", "0.000001")  # ~1 KiB: one stored trajectory is more
    with quota_router.client(key) as grove:
        sandbox = grove.create(**SMALL, heartbeat=False)
        sandbox.exec("head -c 4096 /dev/urandom | base64 > out.txt")
        sandbox.push_artifacts(["out.txt"])
        sandbox.close()
    refused = wait_for(lambda: (r := _create(quota_router, key)).status == 429 and r, 30, interval=0.5,
                       what="the stored-bytes quota")
    message = refused.json()["error"]["message"]
    assert "'stored_bytes' quota" in message and "grove storage gc" in message, message
    assert int(refused.headers["Retry-After"]) >= 1
    quota_router.delete_all()  # what the polling made before the figure came in
    assert _create(quota_router, _key(quota_router, "other")).status == 201
