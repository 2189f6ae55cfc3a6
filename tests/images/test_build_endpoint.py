"""``POST /v1/images/build`` against a real router: the context sent as a tar, the router running grove's builder
(every step a real sandbox of the caller's project), the output streamed as JSON lines ending with the image or
the failing line; ``grove image build --remote`` uses it. Bad calls are a clear 4xx before anything is built."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from pathlib import Path

import pytest

from grove.client import Grove
from tests.images.test_build import _context
from tests.images.test_commit import pulled_base
from tests.support.imagetools import layer_tar
from tests.support.registry import Registry
from tests.support.router_fixtures import RouterProcess, wait_for


@pytest.fixture(scope="module")
def base(router: RouterProcess, registry: Registry, base_layer: bytes, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The busybox base, in a registry and pulled into the router's store."""
    return pulled_base(router, registry, base_layer, tmp_path_factory.mktemp("oci"), "remotebase")


def _post(router: RouterProcess, query: str, body: bytes, headers: dict[str, str] | None = None,
          key: str | None = None) -> tuple[int, list[dict[str, object]] | dict[str, object]]:
    """A raw call: (status, the JSON lines of a 200, else the error body)."""
    url = urllib.parse.urlsplit(router.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=300)
    try:
        conn.request("POST", f"/v1/images/build?{query}", body=body,
                     headers={"Authorization": f"Bearer {key or router.key}", "Content-Type": "application/x-tar",
                              **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        return resp.status, json.loads(data)
    assert resp.getheader("Content-Type") == "application/x-ndjson"
    return 200, [json.loads(line) for line in data.splitlines()]


def test_remote_build_with_the_cli_then_cached(router: RouterProcess, grove: Grove, base: str, tmp_path: Path) -> None:
    dockerfile = f"FROM {base}\nARG WHO=nobody\nWORKDIR /srv\nCOPY app.txt ./\nRUN echo \"$WHO $(cat app.txt)\" > out\n"
    ctx = _context(tmp_path / "remote", dockerfile, {"app.txt": "built remotely\n", ".dockerignore": "*.log\n",
                                                     "noise.log": "x\n"})
    done = router.cli("image", "build", "--remote", "-t", "remote-app", "--build-arg", "WHO=grove", str(ctx),
                      timeout=300)
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode() + out
    assert "STEP 4/4: RUN" in out and out.strip().splitlines()[-1].startswith("built remote-app sha256:"), out
    with grove.create("remote-app") as sb:
        r = sb.exec("cat /srv/out; ls /srv")
        assert r.stdout == b"grove built remotely\napp.txt\nout\n", r.stderr
    # The same build again: every step found in the cache the client-side builder shares.
    again = router.cli("image", "build", "--remote", "-t", "remote-app", "--build-arg", "WHO=grove", str(ctx),
                       timeout=300)
    assert again.returncode == 0, again.stderr.decode()
    assert "(3 steps, 3 cached," in again.stdout.decode(), again.stdout.decode()
    assert router.live_ids() == set()


def test_a_failing_step_ends_the_stream_naming_its_line(router: RouterProcess, base: str) -> None:
    dockerfile = f"FROM {base}\nRUN echo first\nRUN echo about to fail && exit 3\nRUN echo never\n".encode()
    status, lines = _post(router, "tag=broken", layer_tar({"Dockerfile": dockerfile}))
    assert status == 200 and isinstance(lines, list)
    said = [m["line"] for m in lines if "line" in m]
    assert "  about to fail" in said and "  never" not in said, said
    last = lines[-1]
    assert last["error"] == {"code": "invalid", "message": "line 3: RUN echo about to fail && exit 3 failed: the "
                                                           "command exited with code 3"}, last
    assert router.http("GET", "/v1/images/broken").status == 404
    wait_for(lambda: not router.live_ids(), timeout=30, what="the failed step's sandbox gone")


def test_a_build_counts_against_the_callers_project(router: RouterProcess, base: str, tmp_path: Path) -> None:
    made = router.cli("project", "create", "nobuild", "--sandboxes", "0")
    assert made.returncode == 0, made.stderr.decode()
    key = router.member_key("nobuild", "nobuild-member")
    status, lines = _post(router, "tag=quota-app", layer_tar({"Dockerfile": f"FROM {base}\nRUN true\n".encode()}),
                          key=key)
    assert status == 200 and isinstance(lines, list)
    error = lines[-1]["error"]
    assert isinstance(error, dict) and error["code"] == "quota_exceeded" and "nobuild" in str(error["message"]), error
    assert router.http("GET", "/v1/images/quota-app").status == 404


@pytest.mark.parametrize(("query", "body", "status", "message"), [
    ("tag=x", layer_tar({"Containerfile": b"FROM busybox\n"}), 400,
     "dockerfile 'Dockerfile': no such file in the build"),
    ("tag=x&dockerfile=../../etc/passwd", layer_tar({"Dockerfile": b"FROM busybox\n"}), 400,
     "no such file in the build"),
    ("tag=x", b"", 400, "the body is empty: send the build context as a tar"),
    ("tag=x", b"not a tar at all" * 100, 400, "not a build context this router can unpack as a tar"),
    ("tag=x", layer_tar({"../escape": b"x", "Dockerfile": b"FROM busybox\n"}), 400, "not a build context"),
    ("tag=x&build_arg=NOEQUALS", layer_tar({"Dockerfile": b"FROM busybox\n"}), 400, "build_arg takes K=V"),
    ("tag=x&network=open", layer_tar({"Dockerfile": b"FROM busybox\n"}), 422,
     "query.network' must be one of deny, allow"),
    ("dockerfile=Dockerfile", layer_tar({"Dockerfile": b"FROM busybox\n"}), 400, "query: field 'tag' is required"),
])
def test_bad_calls_are_refused_before_building(router: RouterProcess, query: str, body: bytes, status: int,
                                               message: str) -> None:
    got, answer = _post(router, query, body)
    assert got == status and isinstance(answer, dict), (got, answer)
    error = answer["error"]
    assert isinstance(error, dict) and message in str(error["message"]), error
    assert router.live_ids() == set()


def test_a_context_too_big_is_413_before_it_is_read(router: RouterProcess) -> None:
    url = urllib.parse.urlsplit(router.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:  # announces 600 MiB, sends 64 KiB: refused on the announcement
        conn.putrequest("POST", "/v1/images/build?tag=huge")
        for name, value in (("Authorization", f"Bearer {router.key}"), ("Content-Type", "application/x-tar"),
                            ("Content-Length", str(600 << 20))):
            conn.putheader(name, value)
        conn.endheaders()
        conn.send(b"\0" * 65536)
        resp = conn.getresponse()
        answer = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 413, answer
    assert "a build takes at most" in answer["error"]["message"], answer


def _builds_of(router: RouterProcess) -> list[int]:
    """PIDs of build processes serving this router (``python -m grove.build --url`` its port)."""
    port = router.url.rsplit(":", 1)[1]
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"grove.build" in argv and any(a.endswith(f":{port}".encode()) for a in argv):
                found.append(int(proc.name))
    return found


def test_a_caller_gone_mid_build_ends_the_build(router: RouterProcess, base: str) -> None:
    url = urllib.parse.urlsplit(router.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    try:
        conn.request("POST", "/v1/images/build?tag=abandoned&no_cache=1",
                     body=layer_tar({"Dockerfile": f"FROM {base}\nRUN sleep 600\n".encode()}),
                     headers={"Authorization": f"Bearer {router.key}", "Content-Type": "application/x-tar"})
        resp = conn.getresponse()
        assert resp.status == 200
        while b"STEP 1/1: RUN sleep 600" not in resp.readline():
            pass
        wait_for(lambda: router.live_ids(), timeout=60, what="the RUN step's sandbox")
        assert _builds_of(router)
    finally:
        conn.close()  # the caller goes mid-step
    wait_for(lambda: not _builds_of(router), timeout=60, what="the build's process ended")
    wait_for(lambda: not router.live_ids(), timeout=60, what="the step's sandbox deleted")
    assert router.http("GET", "/v1/images/abandoned").status == 404
