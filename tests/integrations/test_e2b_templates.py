"""An E2B template whose image records a start command (``CMD``) and a port (``EXPOSE``): the real ``e2b`` SDK's
create answers once the command runs on the sandbox's process table and its port accepts; a command that fails
fails the create with its own words, and leaves no sandbox. Images built by ``grove image build`` from a busybox
base in a real registry on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from tests.integrations.test_e2b import steps_of
from tests.support.imagetools import make_busybox_rootfs, tar_directory
from tests.support.registry import registry_server, write_oci_layout
from tests.support.router_fixtures import RouterProcess, wait_for

SERVED = """\
FROM {base}
RUN mkdir -p /srv && echo served > /srv/index.html
EXPOSE 8099
CMD ["/bin/busybox", "httpd", "-f", "-p", "127.0.0.1:8099", "-h", "/srv"]
"""
BROKEN = """\
FROM {base}
EXPOSE 8098
CMD ["sh", "-c", "echo no server here >&2; exit 4"]
"""


@pytest.fixture(scope="module")
def templates(router: RouterProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``served`` and ``broken``: busybox images built with a start command each."""
    tmp = tmp_path_factory.mktemp("templates")
    with registry_server() as registry:
        write_oci_layout(tmp / "tmplbase", [[tar_directory(make_busybox_rootfs(tmp / "rootfs"))]])
        registry.push(tmp / "tmplbase", "tmplbase:1")
        base = registry.ref("tmplbase:1")
        done = router.cli("image", "pull", "--insecure", base, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        for name, dockerfile in (("served", SERVED), ("broken", BROKEN)):
            context = Path(tmp / name)
            context.mkdir()
            (context / "Dockerfile").write_text(dockerfile.format(base=base))
            done = router.cli("image", "build", "-t", name, str(context), timeout=300)
            assert done.returncode == 0, done.stderr.decode() + done.stdout.decode()
    yield
    for name in ("served", "broken"):
        router.cli("image", "rm", name)


def test_create_starts_the_templates_command_and_waits_for_its_port(router: RouterProcess, e2b_env: None,
                                                                    templates: None) -> None:
    sbx = Sandbox.create("served", timeout=120)
    try:
        with router.client() as client:
            sandbox = client.attach(sbx.sandbox_id)
            # Ready when create answered: no waiting here.
            assert sandbox.exec("wget -qO- http://127.0.0.1:8099/index.html").stdout == b"served\n"
            [server] = sandbox.processes.list()
            assert server.running and server.command[:2] == ["/bin/busybox", "httpd"]
        assert [p.pid for p in sbx.commands.list()] == [server.pid]  # E2B sees the same process
        [start] = [s for s in steps_of(router, sbx.sandbox_id) if s["type"] == "process"]
        assert start["event"] == "start" and start["command"] == server.command
    finally:
        sbx.kill()


def test_a_start_command_that_fails_fails_the_create_with_its_words(router: RouterProcess, e2b_env: None,
                                                                   templates: None) -> None:
    before = router.live_ids()
    with pytest.raises(SandboxException, match="exited with 4 before port 8098 answered") as failed:
        Sandbox.create("broken", timeout=120)
    assert "no server here" in str(failed.value)
    assert router.live_ids() == before  # the sandbox went with its failed create


def test_a_template_served_by_a_warm_pool_starts_its_command_on_the_claimed_sandbox(
        router: RouterProcess, e2b_env: None, templates: None) -> None:
    # A pool named for the template: E2B's create claims from it, and the command starts after the claim (a pool's
    # idle members run nothing but their executor).
    made = router.http("POST", "/v1/pools", json_body={"name": "served-pool", "image": "served", "size": 1})
    assert made.status == 201, made.body
    try:
        wait_for(lambda: router.http("GET", "/v1/pools/served-pool").json()["ready"] == 1, timeout=120,
                 what="a ready member of the pool")
        sbx = Sandbox.create("served-pool", timeout=120)
        assert router.http("GET", "/v1/pools/served-pool").json()["claims"] == 1
        with router.client() as client:
            sandbox = client.attach(sbx.sandbox_id)
            assert sandbox.exec("wget -qO- http://127.0.0.1:8099/index.html").stdout == b"served\n"
            assert [p.command[:2] for p in sandbox.processes.list()] == [["/bin/busybox", "httpd"]]
        sbx.kill()
    finally:
        router.http("DELETE", "/v1/pools/served-pool")
