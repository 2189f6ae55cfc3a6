"""``grove up --pull-missing``: a create naming a registry image the store lacks pulls it first, and a
registry's refusal is the create's answer (404 for an image it does not have, 502 otherwise)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from grove.client import Grove
from tests.conftest import free_tcp_port
from tests.support.imagetools import make_busybox_rootfs, tar_directory
from tests.support.registry import Registry, write_oci_layout
from tests.support.router_fixtures import RouterProcess, error_of, router_state


@pytest.fixture(scope="module")
def router(registry: Registry) -> Iterator[RouterProcess]:
    """The module's router, pulling on demand, plain HTTP allowed to the test registry only."""
    with router_state(up_args=("--pull-missing", "--insecure-registry", registry.host)) as r:
        yield r


def test_a_create_pulls_what_the_store_lacks(
    router: RouterProcess, grove: Grove, registry: Registry, tmp_path: Path
) -> None:
    rootfs = make_busybox_rootfs(tmp_path / "rootfs")
    digests = write_oci_layout(tmp_path / "img", [[tar_directory(rootfs), {"hello": b"pulled on demand\n"}]])
    registry.push(tmp_path / "img", "ondemand:1")
    ref = registry.ref("ondemand:1")
    sb = grove.create(ref)
    assert sb.info["image"] == ref and sb.info["image_digest"] == digests[0]
    assert sb.exec("cat /hello").stdout == b"pulled on demand\n"
    listing = router.cli("image", "ls").stdout.decode()
    assert ref in listing and digests[0] in listing


def test_registry_answers_become_the_creates_answer(router: RouterProcess, registry: Registry) -> None:
    reply = router.http("POST", "/v1/sandboxes", json_body={"image": registry.ref("no/such:image")})
    assert reply.status == 404, reply.body
    assert "manifest unknown" in error_of(reply)["message"] and registry.host in error_of(reply)["message"]
    nobody = f"127.0.0.1:{free_tcp_port()}/x/y:1"  # nothing listens there
    reply = router.http("POST", "/v1/sandboxes", json_body={"image": nobody})
    assert reply.status == 502 and "127.0.0.1" in error_of(reply)["message"], reply.body
    # A plain name is never looked up in a registry.
    reply = router.http("POST", "/v1/sandboxes", json_body={"image": "not-here"})
    assert reply.status == 404 and "known images" in error_of(reply)["message"]
    assert router.http("GET", "/v1/sandboxes").json()["sandboxes"] == []
