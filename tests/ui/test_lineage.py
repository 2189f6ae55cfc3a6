"""The viewer's lineage tree, in a real browser, on lineage grove made: a trajectory, two replays of it (one kept
running), a replay of a replay. Each page shows the whole family, its own node marked, and its links open each
branch; a trajectory of no family shows no tree."""

from __future__ import annotations

import pytest

from grove.client import Grove
from tests.support.router_fixtures import RouterProcess
from tests.ui.conftest import Viewer

pytestmark = pytest.mark.embedded_s3  # the viewer's fixtures read the router's own bucket


def replay(router: RouterProcess, sandbox_id: str, **body: object) -> str:
    reply = router.http("POST", f"/v1/trajectories/{sandbox_id}/replay", json_body=body)
    assert reply.status == 200, reply.body
    sandbox: str = reply.json()["sandbox_id"]
    return sandbox


def test_a_trajectorys_lineage_tree_links_every_branch(viewer: Viewer, grove: Grove) -> None:
    root = grove.create(heartbeat=False, metadata={"task_id": "lineage-task"})
    root.exec("echo one > /tmp/a")
    root.exec("cat /tmp/a")
    root.close()
    early = replay(viewer.router, root.id, until=0, keep=False)  # stored: a replay up to the first command
    child = replay(viewer.router, root.id, keep=False)
    grandchild = replay(viewer.router, child, keep=False)
    running = replay(viewer.router, root.id, until=0)  # live, not stored yet

    viewer.login()
    viewer.open(f"/ui/trajectories/{child}")
    tree = viewer.wait(lambda: viewer.css("#lineage:not([hidden]) .lineage-tree"), what="the lineage tree")[0]
    nodes = [li.get_attribute("data-id") for li in tree.find_elements("css selector", "li")]
    assert nodes[0] == root.id and set(nodes) == {root.id, early, child, grandchild, running}, nodes
    # Nested as made: the root's branches under it, the grandchild under its parent.
    under_child = tree.find_element("css selector", f'li[data-id="{child}"] ul')
    assert [li.get_attribute("data-id") for li in under_child.find_elements("css selector", "li")] == [grandchild]
    current = tree.find_element("css selector", "a.current")
    assert current.text == child and current.get_attribute("aria-current") == "page"
    assert "replay at step" in tree.find_element("css selector", f'li[data-id="{early}"] .lineage-kind').text
    assert "live" in tree.find_element("css selector", f'li[data-id="{running}"]').text
    viewer.snap("lineage")

    tree.find_element("css selector", f'li[data-id="{grandchild}"] > a').click()  # opens that branch
    viewer.wait(lambda: viewer.browser.current_url.endswith(f"/ui/trajectories/{grandchild}"), what="the branch")
    mark = viewer.wait(lambda: viewer.css("#lineage a.current"), what="the branch's tree")[0]
    assert mark.text == grandchild
    assert viewer.text("#sandbox-id") == grandchild

    viewer.open(f"/ui/trajectories/{running}")
    viewer.wait(lambda: viewer.css("#lineage a.current"), what="the live branch's tree")
    grove.attach(running).close()

    lone = grove.create(heartbeat=False)
    lone.exec("true")
    lone.close()
    viewer.open(f"/ui/trajectories/{lone.id}")
    viewer.wait(lambda: "true" in viewer.text("#timeline"), what="the lone trajectory's steps")
    reply = viewer.get(f"/ui/api/trajectories/{lone.id}/lineage", viewer.session())
    assert reply.status == 200 and [n["id"] for n in reply.json()["nodes"]] == [lone.id]
    assert viewer.css("#lineage")[0].get_attribute("hidden") is not None
    assert viewer.get("/ui/api/trajectories/sb-0000000000000000/lineage", viewer.session()).status == 404
