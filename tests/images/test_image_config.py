"""An image's recorded config applied to the sandboxes made from it, through a real router: a pulled image's OCI
``Env`` and ``WorkingDir``, a built image's ``ENV`` and ``WORKDIR`` (on top of its base's, as Docker inherits
them), seen by exec in a new sandbox, fresh, claimed from a pool or made in a batch; the create's own ``env`` and
``workdir`` win; an image without config starts as before; the applied config is in the record and trajectory."""

from __future__ import annotations

import json

import pytest

from grove.client import Grove
from router.records.image_config import ImageRunConfig
from tests.support.registry import Registry, write_oci_layout
from tests.support.router_fixtures import RouterProcess, wait_for

BASE_CONFIG = {"Env": ["PATH=/bin", "FROM_BASE=base", "SHARED=base"], "WorkingDir": "/opt"}
DOCKERFILE = """\
FROM {base}
ENV APP_MODE=built SHARED=app
WORKDIR /srv/app
RUN echo "$FROM_BASE in $(pwd)" > seen
USER nobody
"""
SHOW = "pwd; echo $APP_MODE $FROM_BASE $SHARED; id -u"


@pytest.fixture(scope="module")
def base(router: RouterProcess, registry: Registry, base_layer: bytes, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A busybox image whose OCI config sets Env and WorkingDir, pulled into the router's store."""
    oci = tmp_path_factory.mktemp("oci") / "cfgbase"
    write_oci_layout(oci, [[base_layer]], run_config=BASE_CONFIG)
    registry.push(oci, "cfgbase:1")
    ref = registry.ref("cfgbase:1")
    done = router.cli("image", "pull", "--insecure", ref, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    return ref


@pytest.fixture(scope="module")
def built(router: RouterProcess, base: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """``cfg-app``: built FROM the base with its own ENV, WORKDIR and USER."""
    ctx = tmp_path_factory.mktemp("ctx")
    (ctx / "Dockerfile").write_text(DOCKERFILE.format(base=base))
    done = router.cli("image", "build", "-t", "cfg-app", str(ctx), timeout=300)
    assert done.returncode == 0, done.stderr.decode() + done.stdout.decode()
    return "cfg-app"


def _exec(grove: Grove, image: str, **options: object) -> tuple[str, dict[str, object]]:
    with grove.create(image, **options) as sb:
        r = sb.exec(SHOW)
        assert r.exit_code == 0, r.stderr
        return r.stdout.decode(), dict(sb.info)


def test_a_built_image_starts_with_its_env_and_workdir(router: RouterProcess, grove: Grove, built: str) -> None:
    with grove.create(built) as sb:
        r = sb.exec(f"{SHOW}; cat seen")
        # The image's WORKDIR and ENV (its base's FROM_BASE inherited, SHARED overridden by the Dockerfile); the
        # RUN step itself ran with the base's env in the Dockerfile's WORKDIR. USER is recorded, not applied.
        assert r.stdout == b"/srv/app\nbuilt base app\n0\nbase in /srv/app\n", r.stderr
        applied = sb.info["image_config"]
        assert sb.info["workdir"] == "/srv/app"
        assert applied["env"] == {"PATH": "/bin", "FROM_BASE": "base", "SHARED": "app", "APP_MODE": "built"}
        assert (applied["workdir"], applied["user"]) == ("/srv/app", "nobody")
        assert applied["digest"].startswith("sha256:")
        sandbox_id = sb.id
    meta = json.loads((router.layout.images / built / "image.json").read_text())
    assert ImageRunConfig.of(meta["config"]).digest == applied["digest"]  # type: ignore[union-attr]
    trajectory = wait_for(lambda: _stored(router, sandbox_id), timeout=60, what="the stored trajectory")
    assert trajectory["sandbox"]["image_config"] == applied
    assert trajectory["sandbox"]["workdir"] == "/srv/app"


def _stored(router: RouterProcess, sandbox_id: str) -> dict[str, object] | None:
    reply = router.http("GET", f"/v1/trajectories/{sandbox_id}")
    return reply.json() if reply.status == 200 else None  # type: ignore[no-any-return]


def test_the_create_env_and_workdir_win(grove: Grove, built: str) -> None:
    out, info = _exec(grove, built, env={"APP_MODE": "mine"}, workdir="/tmp")
    assert out == "/tmp\nmine base app\n0\n"
    assert info["workdir"] == "/tmp"
    # Named explicitly, grove's own default is the create's choice too (not the image's).
    out, _ = _exec(grove, built, workdir="/workspace")
    assert out.splitlines()[0] == "/workspace"


def test_a_pulled_image_starts_with_its_oci_config(grove: Grove, base: str) -> None:
    out, info = _exec(grove, base)
    assert out == "/opt\nbase base\n0\n"
    assert info["image_config"]["workdir"] == "/opt"  # type: ignore[index]


def test_an_image_without_config_starts_as_before(grove: Grove) -> None:
    out, info = _exec(grove, "default")
    assert out == "/workspace\n\n0\n"
    assert info["workdir"] == "/workspace" and "image_config" not in info


def test_a_retried_create_finds_its_sandbox(router: RouterProcess, grove: Grove, built: str) -> None:
    body = {"image": built, "request_id": "cfg-retry", "env": {"X": "1"}}
    first = router.http("POST", "/v1/sandboxes", json_body=body)
    assert first.status == 201, first.body
    again = router.http("POST", "/v1/sandboxes", json_body=body)
    assert again.status == 201 and again.json()["id"] == first.json()["id"], again.body
    other = router.http("POST", "/v1/sandboxes", json_body={**body, "workdir": "/tmp"})
    assert other.status == 409 and "another body" in other.json()["error"]["message"], other.body


def test_batch_items_and_pool_claims_get_the_config(router: RouterProcess, grove: Grove, built: str) -> None:
    made = grove.create_many([{"image": built}, {"image": built, "workdir": "/tmp"}])
    try:
        assert [sb.exec("pwd; echo $APP_MODE").stdout for sb in made] == [b"/srv/app\nbuilt\n", b"/tmp\nbuilt\n"]
    finally:
        for sb in made:
            sb.close()
    pool = router.http("POST", "/v1/pools", json_body={"name": "cfgpool", "image": built, "size": 3})
    assert pool.status == 201, pool.body
    try:
        wait_for(lambda: router.http("GET", "/v1/pools/cfgpool").json()["ready"] == 3, timeout=180,
                 what="three ready pool members")
        out, info = _exec(grove, "default", pool="cfgpool")  # one claim
        assert out == "/srv/app\nbuilt base app\n0\n"
        assert info["image_config"]["workdir"] == "/srv/app"  # type: ignore[index]
        claimed = grove.create_many(2, pool="cfgpool")  # a batch's alike claims, claimed as one group
        try:
            assert [sb.exec("pwd; echo $APP_MODE").stdout for sb in claimed] == [b"/srv/app\nbuilt\n"] * 2
        finally:
            for sb in claimed:
                sb.close()
        assert router.http("GET", "/v1/pools/cfgpool").json()["claims"] == 3
    finally:
        assert router.http("DELETE", "/v1/pools/cfgpool").status in (200, 204)


def test_image_run_config_reads_env_entries_as_docker_does() -> None:
    config = ImageRunConfig.of({"Env": ["A=1", "B==2", "NOEQUALS", "=x", "A=3"], "WorkingDir": "rel"})
    assert config is not None
    assert config.env == {"A": "3", "B": "=2"} and config.workdir == "/rel" and config.user is None
    assert ImageRunConfig.of({"Cmd": ["sh"], "Env": []}) is None


def test_the_image_answer_carries_its_config(router: RouterProcess, built: str) -> None:
    answer = router.http("GET", f"/v1/images/{built}").json()
    assert answer["config"]["WorkingDir"] == "/srv/app" and answer["config"]["User"] == "nobody"
