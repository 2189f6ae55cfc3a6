"""The S3 server dies: finished trajectories wait in the spool, readable, and all go up once it is back."""

from __future__ import annotations

import os
import signal

from tests.support.router_fixtures import RouterProcess, process_alive, wait_for


def test_s3_killed_then_back_loses_nothing(fresh_router: RouterProcess) -> None:
    router = fresh_router
    s3_dir = router.layout.s3
    weed = int((s3_dir / "grove-s3.pid").read_text())
    assert process_alive(weed)
    os.kill(weed, signal.SIGKILL)
    wait_for(lambda: not process_alive(weed), 10, what="weed gone")

    ids = []
    with router.client() as grove:
        for i in range(3):
            sb = grove.create(heartbeat=False, metadata={"task_id": f"s3-down-{i}"})
            assert sb.exec(f"echo run-{i}").stdout == f"run-{i}\n".encode()
            sb.close()  # delete: the trajectory is stored now, with S3 down
            ids.append(sb.id)
    spool = router.layout.spool
    assert sorted(p.stem for p in spool.glob("sb-*")) == sorted(ids)
    for i, sandbox_id in enumerate(ids):  # readable from the spool meanwhile
        reply = router.http("GET", f"/v1/trajectories/{sandbox_id}")
        assert reply.status == 200, reply.body
        assert f"run-{i}" in reply.body.decode()

    # S3 back (a restarted router starts its embedded server again): the spool drains, nothing lost.
    router.stop()
    assert sorted(p.stem for p in spool.glob("sb-*")) == sorted(ids)  # still spooled, never dropped
    router.start()
    wait_for(lambda: not list(spool.glob("sb-*")), 30, interval=0.25, what="spool drained")
    for i, sandbox_id in enumerate(ids):
        reply = router.http("GET", f"/v1/trajectories/{sandbox_id}")
        assert reply.status == 200 and f"run-{i}" in reply.body.decode(), reply.body[:300]
    listed = router.http("GET", "/v1/trajectories").json()
    entries = listed.get("trajectories", []) if isinstance(listed, dict) else listed
    found = {t.get("sandbox_id") or t.get("id") for t in entries}
    assert set(ids) <= found, listed
