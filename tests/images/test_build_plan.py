"""What ``grove image build`` makes of a Dockerfile and a context before any sandbox runs: the plan (dockerfile-parse
underneath), the image config it records, the refusals by line, and which context files a COPY takes."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from grove.build.builder import image_config
from grove.build.context import BuildContext
from grove.build.dockerfile import parse
from grove.build.remote import _sent
from grove.client.upload import spool_tar
from grove.core.errors import Invalid

pytestmark = pytest.mark.fast


def test_plan_expands_args_and_records_config() -> None:
    plan = parse(b'ARG BASE=debian:12\nFROM ${BASE}\nARG V=1\nENV A=$V B="two words"\nWORKDIR /src\n'
                 b'WORKDIR app\nUSER 1000\nCMD ["run", "--fast"]\nENTRYPOINT exec me\nLABEL k=v\nEXPOSE 80 53/udp\n',
                 {"V": "2"})
    assert plan.base == "debian:12" and plan.digest.startswith("sha256:")
    assert [s.line for s in plan.steps][:3] == [3, 4, 5]
    config = image_config(plan)
    assert config["Env"] == ["A=2", "B=two words"] and config["WorkingDir"] == "/src/app"
    assert config["User"] == "1000" and config["Cmd"] == ["run", "--fast"]
    assert config["Entrypoint"] == ["/bin/sh", "-c", "exec me"] and config["Labels"] == {"k": "v"}
    assert config["ExposedPorts"] == ["80/tcp", "53/udp"]


def test_plan_of_stages() -> None:
    plan = parse(b"ARG V=1\nFROM base:$V AS Build\nENV X=1\nRUN make\nFROM build AS test\nRUN check\n"
                 b"FROM runtime:${V}\nARG V\nCOPY --from=build /out /app\n", {"V": "2"})
    assert [(s.base, s.name, [step.line for step in s.steps]) for s in plan.stages] == [
        ("base:2", "build", [3, 4]), ("build", "test", [6]), ("runtime:2", None, [8, 9])]
    # The image is the last stage's; each stage has its own ENV scope (Docker's: a stage starts from its FROM).
    assert plan.base == "runtime:2" and plan.steps == plan.stages[-1].steps
    assert plan.stages[0].steps[1].envs == {"X": "1"} and plan.steps[1].envs == {}


def test_image_bases_name_what_a_stage_starts_from() -> None:
    # A FROM naming an earlier stage (any case) starts from it; a stage index is no stage name for a FROM.
    plan = parse(b"FROM base:1 AS Build\nRUN make\nFROM BUILD\nFROM 0\nFROM build AS x\nFROM x\n", {})
    assert plan.image_bases() == ["base:1", None, "0", None, None]


@pytest.mark.parametrize(("text", "message"), [
    (b"FROM a AS one\nFROM b AS ONE\n", "line 2: FROM b AS ONE: stage name 'one' is taken by an earlier stage"),
    (b"FROM a AS 1\n", "line 1: FROM a AS 1: stage name '1' is a number"),
    (b"FROM a AS\n", "line 1: FROM a AS: only `FROM IMAGE \\[AS NAME\\]`"),
    (b"FROM a\nVOLUME /data\n", "line 2: VOLUME is not supported"),
    (b"FROM a\nFROBNICATE x\n", "line 2: unknown instruction FROBNICATE"),
    (b"RUN true\nFROM a\n", "line 1: RUN before FROM"),
    (b"# nothing\n", "no FROM line"),
    (b"FROM --platform=linux/arm64 a\n", "line 1: FROM --platform=linux/arm64 a"),
])
def test_plan_refuses_by_line(text: bytes, message: str) -> None:
    with pytest.raises(Invalid, match=message):
        parse(text, {})


def _names(ctx: BuildContext, sources: list[str], dest: str) -> list[str]:
    packed = ctx.pack(ctx.sources(sources, "line 2: COPY"), dest)
    with packed.tar, tarfile.open(fileobj=packed.tar) as tf:
        return sorted(tf.getnames())


def test_context_selection_globs_ignores_and_escapes(tmp_path: Path) -> None:
    (tmp_path / "ctx" / "src" / "pkg").mkdir(parents=True)
    for rel in ("a.py", "b.py", "c.txt", "src/pkg/m.py", "src/pkg/m.pyc"):
        (tmp_path / "ctx" / rel).write_text(rel)
    (tmp_path / "ctx" / ".dockerignore").write_text("**/*.pyc\nb.py\n")
    (tmp_path / "secret").write_text("no")
    (tmp_path / "outdir").mkdir()
    os.symlink("../secret", tmp_path / "ctx" / "out")
    os.symlink("../outdir", tmp_path / "ctx" / "outdir")
    ctx = BuildContext(tmp_path / "ctx")
    assert _names(ctx, ["*.py"], "/app/") == ["app/a.py"]
    assert _names(ctx, ["c.txt"], "/etc/renamed") == ["etc/renamed"]
    assert _names(ctx, ["src"], "/opt") == ["opt", "opt/pkg", "opt/pkg/m.py"]
    assert _names(ctx, ["out"], "/x") == ["x"]  # the symlink itself, as a link
    with pytest.raises(Invalid, match="outside the build context"):
        ctx.sources(["../secret"], "line 2: COPY")
    with pytest.raises(Invalid, match=r"symlink to .*outside the build context"):
        ctx.sources(["outdir"], "line 2: COPY")
    with pytest.raises(Invalid, match="names no file"):
        ctx.sources(["b.py"], "line 2: COPY")  # ignored


def test_content_digest_follows_content_not_times(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("one")
    ctx = BuildContext(tmp_path)
    first = ctx.pack(["f"], "/f").digest
    os.utime(tmp_path / "f", (1, 1))
    assert ctx.pack(["f"], "/f").digest == first
    (tmp_path / "f").write_text("two")
    assert ctx.pack(["f"], "/f").digest != first


def test_a_remote_build_uploads_what_dockerignore_leaves_in(tmp_path: Path) -> None:
    files = {"docker/Dockerfile": "FROM base\n", ".dockerignore": ".dockerignore\ndocker\n.git\nnode_modules\n"
             "app/logs\n!app/logs/keep.log\n", ".git/HEAD": "ref\n", "node_modules/x/index.js": "",
             "app/a.txt": "a\n", "app/logs/old.log": "", "app/logs/keep.log": ""}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    with spool_tar(tmp_path, keep=_sent(BuildContext(tmp_path), "docker/Dockerfile")) as spool, \
            tarfile.open(fileobj=spool) as tar:
        names = sorted(os.path.normpath(m.name) for m in tar.getmembers())
    # The Dockerfile and .dockerignore go up even where .dockerignore names them (the router's build reads both).
    assert names == [".", ".dockerignore", "app", "app/a.txt", "app/logs", "app/logs/keep.log", "docker",
                     "docker/Dockerfile"]
