"""A sandbox's activity clock survives a router restart (issue 31).

Before, a restart set every clock to "now": the sandboxes a killed client had left lived a whole heartbeat timeout
more (the issue's 16 sandboxes of a killed run stayed ``ready`` for about 20 minutes). The reaper now writes the
clocks every few seconds; a restarted router reads them back, with a grace for live clients that could not reach
it meanwhile.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from router.records.activity import RESTART_GRACE_S, restored
from tests.support.router_fixtures import RouterProcess, wait_for

pytestmark = pytest.mark.local_only


def test_the_clock_is_kept_across_a_sigkill_and_a_restart(fresh_router: RouterProcess) -> None:
    router = fresh_router
    with router.client() as grove:
        sb = grove.create(heartbeat=False, heartbeat_timeout_s=900)
        sb.exec("true")
        used = sb.status()["last_activity"]
    wait_for(lambda: json.loads(router.layout.activity.read_text()).get(sb.id) == pytest.approx(used, abs=0.01)
             if router.layout.activity.exists() else False, 20, what="the clock written")
    time.sleep(2.0)
    router.stop(signal.SIGKILL)
    router.start()
    info = router.http("GET", f"/v1/sandboxes/{sb.id}").json()
    # Two seconds and a restart later, the clock is the last call's, not the restart's.
    assert info["last_activity"] == pytest.approx(used, abs=0.01), (info["last_activity"], used, time.time())
    router.http("DELETE", f"/v1/sandboxes/{sb.id}")


@pytest.mark.fast
def test_a_restored_clock_leaves_live_clients_a_grace() -> None:
    now = 10_000.0
    assert restored(None, now, 900) == now  # never written: as before
    assert restored(now - 100, now, 900) == now - 100  # recent: kept as it was
    # Long expired while the router was down: it expires RESTART_GRACE_S after the restart, not at once.
    assert restored(now - 5000, now, 900) == now - 900 + RESTART_GRACE_S
