"""``grove image build`` against a real router: every step in a real sandbox, layers committed into the shared
store, the config and build record in the image, the cache, .dockerignore, build arguments, and the refusals
(a failing RUN by its line, a COPY out of the context, a RUN reaching for the network under --network deny)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from grove.client import Grove
from tests.images.test_commit import pulled_base
from tests.support.registry import Registry
from tests.support.router_fixtures import RouterProcess


@pytest.fixture(scope="module")
def base(router: RouterProcess, registry: Registry, base_layer: bytes, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The busybox base, in a registry and pulled into the router's store."""
    return pulled_base(router, registry, base_layer, tmp_path_factory.mktemp("oci"), "buildbase")


def _context(root: Path, dockerfile: str, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Dockerfile").write_text(dockerfile)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _build(router: RouterProcess, context: Path, tag: str, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return router.cli("image", "build", "-t", tag, *extra, str(context), timeout=300)


def _meta(router: RouterProcess, name: str) -> dict[str, object]:
    meta = json.loads((router.layout.images / name / "image.json").read_text())
    assert isinstance(meta, dict)
    return meta


APP = """\
FROM {base}
ARG GREETING=hello
ENV APP_HOME=/srv/app MODE="two words"
WORKDIR /srv/app
COPY src/ ./src/
RUN echo "$GREETING from $(pwd) in $MODE" > greeting && cat greeting && ls src
LABEL team=evals
EXPOSE 8080
CMD ["sh", "-c", "cat greeting"]
"""


def test_multi_step_build_then_cached_rebuild_and_a_build_arg(
    router: RouterProcess, grove: Grove, base: str, tmp_path: Path
) -> None:
    ctx = _context(tmp_path / "app", APP.format(base=base), {"src/main.sh": "echo main\n", "src/lib/util.sh": "x\n"})
    done = _build(router, ctx, "app")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode() + out
    # The RUN's own output streamed through, each step named.
    assert "hello from /srv/app in two words" in out and "STEP 5/8: RUN" in out
    digest = out.strip().splitlines()[-1].split()[2]
    with grove.create("app") as sb:
        r = sb.exec("cat /srv/app/greeting /srv/app/src/main.sh /srv/app/src/lib/util.sh")
        assert r.stdout == b"hello from /srv/app in two words\necho main\nx\n", r.stderr
        assert sb.info["image_digest"] == digest
    meta = _meta(router, "app")
    config, record = meta["config"], meta["build"]
    assert isinstance(config, dict) and isinstance(record, dict)
    # The base's Env (a pulled image's OCI config) inherited, the Dockerfile's after it.
    assert config["Env"] == ["PATH=/bin", "APP_HOME=/srv/app", "MODE=two words"] and config["WorkingDir"] == "/srv/app"
    assert config["Cmd"] == ["sh", "-c", "cat greeting"] and config["Labels"] == {"team": "evals"}
    assert config["ExposedPorts"] == ["8080/tcp"]
    assert record["base"] == base and record["dockerfile_digest"].startswith("sha256:")
    assert record["base_digest"] == router.http("GET", f"/v1/images/{base}").json()["digest"]

    # Unchanged: every step from the cache, no sandbox made, the same image.
    again = _build(router, ctx, "app")
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout.decode().count("--> cached") == 3 and "hello from" not in again.stdout.decode()
    assert again.stdout.decode().strip().splitlines()[-1].split()[2] == digest

    # A build argument changes the RUN (and only the steps from it on run again).
    other = _build(router, ctx, "app-hi", "--build-arg", "GREETING=bonjour")
    assert other.returncode == 0, other.stderr.decode()
    assert "bonjour from /srv/app" in other.stdout.decode() and other.stdout.decode().count("--> cached") == 2
    assert _meta(router, "app-hi")["build"]["build_args"] == {"GREETING": "bonjour"}  # type: ignore[index]
    with grove.create("app-hi") as sb:
        assert sb.exec("cat /srv/app/greeting").stdout == b"bonjour from /srv/app in two words\n"


def test_failing_run_names_its_line(router: RouterProcess, base: str, tmp_path: Path) -> None:
    ctx = _context(tmp_path / "bad", f"FROM {base}\nRUN echo first\nRUN echo about to fail && \\\n  exit 3\n", {})
    done = _build(router, ctx, "bad")
    assert done.returncode != 0
    err = done.stderr.decode()
    assert "line 3: RUN echo about to fail" in err and "exited with code 3" in err, err
    assert "about to fail" in done.stdout.decode()  # its output came before the error
    assert router.http("GET", "/v1/images/bad").status == 404
    assert router.live_ids() == set()  # the failed step's sandbox is gone


def test_dockerignore_is_honoured(router: RouterProcess, grove: Grove, base: str, tmp_path: Path) -> None:
    files = {"app/a.txt": "a\n", "app/secret.env": "TOKEN=1\n", "app/logs/x.log": "x\n", "app/logs/keep.log": "k\n",
             ".dockerignore": "**/*.env\napp/logs\n!app/logs/keep.log\n"}
    ctx = _context(tmp_path / "ign", f"FROM {base}\nCOPY app /dst\nCOPY . /all/\n", files)
    done = _build(router, ctx, "ign")
    assert done.returncode == 0, done.stderr.decode()
    with grove.create("ign") as sb:
        r = sb.exec("cd /dst && find . -type f | sort")
        assert r.stdout == b"./a.txt\n./logs/keep.log\n", r.stderr
        r = sb.exec("cd /all && find . -type f | sort")
        assert r.stdout == b"./.dockerignore\n./Dockerfile\n./app/a.txt\n./app/logs/keep.log\n", r.stderr


def test_two_images_on_one_base_store_it_once(router: RouterProcess, base: str, tmp_path: Path) -> None:
    for name in ("one", "two"):
        ctx = _context(tmp_path / name, f"FROM {base}\nRUN echo {name} > /which\n", {})
        done = _build(router, ctx, name)
        assert done.returncode == 0, done.stderr.decode()
    one, two = _meta(router, "one")["layers"], _meta(router, "two")["layers"]
    assert isinstance(one, list) and isinstance(two, list)
    assert one[0] == two[0] and one[1] != two[1]
    copies = list((router.layout.images / "layers").glob("*/bin/busybox"))
    assert len(copies) == 1, copies
    # Each step layer holds only what the step changed.
    assert not (router.layout.images / "layers" / one[1].removeprefix("sha256:") / "bin").exists()


def test_copy_out_of_the_context_is_refused(router: RouterProcess, base: str, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text("secret\n")
    ctx = _context(tmp_path / "esc", f"FROM {base}\nCOPY ../outside.txt /x\n", {})
    done = _build(router, ctx, "esc")
    assert done.returncode != 0
    assert "line 2: COPY ../outside.txt /x" in done.stderr.decode() and "outside the build context" in \
        done.stderr.decode()
    os.symlink(tmp_path, ctx / "up")
    (ctx / "Dockerfile").write_text(f"FROM {base}\nCOPY up/outside.txt /x\n")
    done = _build(router, ctx, "esc")
    assert done.returncode != 0 and "leads out of the build context" in done.stderr.decode(), done.stderr.decode()
    assert router.http("GET", "/v1/images/esc").status == 404


def test_run_cannot_reach_the_network_under_deny(router: RouterProcess, base: str, tmp_path: Path) -> None:
    port = router.url.rsplit(":", 1)[1]
    ctx = _context(tmp_path / "net", f"FROM {base}\nRUN ln -s busybox /bin/nc\n"
                                     f"RUN nc -w 3 127.0.0.1 {port} </dev/null || nc -w 3 1.1.1.1 80 </dev/null\n", {})
    done = _build(router, ctx, "net", "--network", "deny")
    assert done.returncode != 0
    assert "line 3: RUN nc" in done.stderr.decode(), done.stderr.decode()
    # Neither the router's port on the host's loopback (127.0.0.1 is the sandbox's own there) nor an outside address.
    out = done.stdout.decode()
    assert "Connection refused" in out and "Network is unreachable" in out, out
    assert router.http("GET", "/v1/images/net").status == 404


def test_derive_refuses_bad_input(router: RouterProcess) -> None:
    missing = router.http("POST", "/v1/images/x", json_body={"source": "no-such-image"})
    assert missing.status == 404 and "no-such-image" in missing.json()["error"]["message"]
    bad = router.http("POST", "/v1/images/x", json_body={"source": "default", "config": {"Env": "A=1"}})
    assert bad.status == 400 and "Env" in bad.json()["error"]["message"]


MULTI = """\
FROM {base} AS builder
WORKDIR /work
RUN mkdir -p out/share && printf '#!/bin/sh\\necho built by stage one\\n' > out/tool && chmod 755 out/tool \\
    && echo data > out/share/a.txt && echo junk > /work/scratch
FROM builder AS tested
RUN ./out/tool > /work/tested.txt
FROM {base}
COPY --from=builder /work/out/tool /usr/local/bin/tool
COPY --from=1 /work/tested.txt /work/out/share /opt/
"""


def test_multi_stage_build_copies_only_what_it_names(router: RouterProcess, grove: Grove, base: str,
                                                     tmp_path: Path) -> None:
    done = _build(router, _context(tmp_path / "multi", MULTI.format(base=base), {}), "multi")
    out = done.stdout.decode()
    assert done.returncode == 0, done.stderr.decode() + out
    assert "STAGE 0 builder: FROM" in out and "STAGE 2: FROM" in out and "STEP 5/5: COPY --from=1" in out, out
    with grove.create("multi") as sb:
        r = sb.exec("/usr/local/bin/tool; cat /opt/tested.txt /opt/a.txt; stat -c %a /usr/local/bin/tool; ls /opt; "
                    "test -e /work || echo no /work")
        assert r.stdout == b"built by stage one\nbuilt by stage one\ndata\n755\na.txt\ntested.txt\nno /work\n", \
            r.stderr
    # The image is its base and its two COPY layers: nothing of the earlier stages' steps (no /work/scratch).
    assert len(_meta(router, "multi")["layers"]) == 3  # type: ignore[arg-type]
    # A --from naming no earlier stage is refused by its line.
    bad = _context(tmp_path / "badfrom", f"FROM {base} AS one\nFROM {base}\nCOPY --from=two /x /y\n", {})
    refused = _build(router, bad, "badfrom")
    assert refused.returncode != 0
    assert "line 3: COPY --from=two /x /y: --from=two names no earlier stage" in refused.stderr.decode(), \
        refused.stderr.decode()
    assert router.live_ids() == set()
