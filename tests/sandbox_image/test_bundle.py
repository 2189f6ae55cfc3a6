"""The runtime bundle: built for real, run on the host, and run in a root filesystem holding only busybox."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_image.bundle import GROVE_PACKAGES, MANIFEST, PORTABLE_LOADER, Bundle, build_bundle, collect_retired

REPO = Path(__file__).resolve().parent.parent.parent
BUSYBOX = Path("/bin/busybox")
THIRD_PARTY = ("flask", "gunicorn", "msgpack", "werkzeug", "zstandard")


@pytest.fixture(scope="session")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Bundle:
    """One bundle for the whole session; a build takes seconds."""
    started = time.monotonic()
    built = build_bundle(tmp_path_factory.mktemp("bundle") / "runtime", repo_root=REPO)
    elapsed = time.monotonic() - started
    size = sum(p.stat().st_size for p in built.path.rglob("*") if p.is_file() and not p.is_symlink())
    print(f"\nbundle built in {elapsed:.2f} s, {size / 2**20:.1f} MiB, stamp {built.stamp}")
    return built


def _run(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env, cwd=cwd)


def _imports() -> str:
    names = list(THIRD_PARTY)
    if (REPO / "grove" / "errors.py").is_file():
        names.append("grove.core.errors")
    return ", ".join(names)


def test_layout(bundle: Bundle) -> None:
    root = bundle.path
    assert (root / "bin" / bundle.python).is_file()
    assert (root / "lib" / bundle.loader).is_file()
    # The arch-neutral name Knative's Service command uses: a relative link, so it resolves wherever the
    # bundle is mounted, to this machine's loader (x86-64 here, aarch64 on an arm64 node).
    link = root / "lib" / PORTABLE_LOADER
    assert link.is_symlink() and link.readlink() == Path(bundle.loader) and link.resolve().is_file()
    assert (root / "lib" / "libpython3.11.so.1.0").is_file()
    assert (root / "lib" / "libc.so.6").is_file()
    assert json.loads((root / MANIFEST).read_text())["stamp"] == bundle.stamp
    stdlib = root / "lib" / "python3.11"
    for absent in ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "unittest/test"):
        assert not (stdlib / absent).exists(), absent
    assert not list(stdlib.glob("config-3.11*"))
    # A pyvenv.cfg would make CPython treat the bundle as a venv of the build host's Python.
    assert not list(root.rglob("pyvenv.cfg"))
    # The bundle is read-only at run time: every module must come precompiled.
    uncompiled = [
        py for py in stdlib.rglob("*.py") if not (py.parent / "__pycache__" / f"{py.stem}.cpython-311.pyc").is_file()
    ]
    assert not uncompiled
    site = stdlib / "site-packages"
    assert (site / "grove" / "__pycache__" / "__init__.cpython-311.pyc").is_file()
    assert list(site.glob("flask-*.dist-info"))
    # Only what the executor needs: the build host's other site-packages stay out.
    assert not (site / "pytest").exists() and not (site / "aiohttp").exists()


def test_runs_on_host_and_ignores_python_environment(bundle: Bundle, tmp_path: Path) -> None:
    code = f"import json, sys, {_imports()}; print(json.dumps({{'prefix': sys.prefix, 'path': sys.path}}))"
    # -I must shield the executor from whatever the sandbox sets.
    env = {"PATH": "/usr/bin:/bin", "PYTHONHOME": "/nonexistent", "PYTHONPATH": str(tmp_path)}
    (tmp_path / "flask.py").write_text("raise SystemExit('shadowed by PYTHONPATH')\n")
    portable = Bundle(bundle.path, bundle.stamp, loader=PORTABLE_LOADER)
    for argv in (bundle.python_argv(bundle.path), portable.python_argv(bundle.path)):
        proc = _run([*argv, "-c", code], env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["prefix"] == str(bundle.path)
    assert all(p.startswith(str(bundle.path) + "/") for p in info["path"]), info["path"]


def test_noop_rebuild_is_fast(bundle: Bundle) -> None:
    inode = (bundle.path / MANIFEST).stat().st_ino
    started = time.monotonic()
    again = build_bundle(bundle.path, repo_root=REPO)
    elapsed = time.monotonic() - started
    assert again == bundle
    assert elapsed < 0.5, elapsed
    assert (bundle.path / MANIFEST).stat().st_ino == inode  # not rebuilt


def test_changed_source_rebuilds(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for package in GROVE_PACKAGES:
        shutil.copytree(REPO / package, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
    dest = tmp_path / "runtime"
    first = build_bundle(dest, repo_root=repo)
    with (repo / "grove" / "__init__.py").open("a") as f:
        f.write("MARKER = 1\n")
    second = build_bundle(dest, repo_root=repo)
    assert second.stamp != first.stamp
    assert "MARKER = 1" in (dest / "lib/python3.11/site-packages/grove/__init__.py").read_text()
    # The first bundle is retired, not deleted (running sandboxes may have it mounted), until nothing
    # uses it; nothing else of the two builds is left.
    retired = f".runtime.retired-{first.stamp}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".runtime.lock", retired, "repo", "runtime"]
    assert "MARKER" not in (tmp_path / retired / "lib/python3.11/site-packages/grove/__init__.py").read_text()
    assert collect_retired(dest, keep={first.stamp}) == []
    assert collect_retired(dest, keep={second.stamp}) == [first.stamp]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".runtime.lock", "repo", "runtime"]


def test_cli(bundle: Bundle) -> None:
    python = [sys.executable, "-m", "sandbox_image.bundle"]
    built = _run([*python, "build", str(bundle.path)], cwd=REPO)
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout) == {"path": str(bundle.path), "stamp": bundle.stamp}
    argv = _run([*python, "argv", str(bundle.path)], cwd=REPO)
    assert argv.returncode == 0, argv.stderr
    assert (
        json.loads(argv.stdout)
        == bundle.python_argv()
        == [
            "/.grove/lib/ld-linux-x86-64.so.2",
            "--library-path",
            "/.grove/lib",
            "/.grove/bin/python3.11",
            "-I",
        ]
    )


def test_entrypoint_copy_keeps_bytecode_valid(bundle: Bundle, tmp_path: Path) -> None:
    """The init container's copy must keep modes and mtimes, or every start recompiles in memory."""
    dest = tmp_path / "emptydir"
    proc = _run(
        ["/bin/sh", str(REPO / "sandbox_image" / "entrypoint.sh"), str(dest)],
        env={"PATH": "/usr/bin:/bin", "GROVE_RUNTIME_DIR": str(bundle.path)},
    )
    assert proc.returncode == 0, proc.stderr

    def pycs() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in dest.rglob("*.pyc")}

    before = pycs()
    # The copy is writable, so CPython would rewrite any .pyc it found stale.
    code = f"import {_imports()}, gunicorn.app.wsgiapp, gunicorn.workers.gthread, json, email.parser"
    run = _run([*Bundle.load(dest).python_argv(dest), "-c", code], env={"PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert pycs() == before


@pytest.fixture
def busybox_root(tmp_path: Path) -> Iterator[Path]:
    """A root filesystem with nothing in it but a static busybox: no libc, no loader, no Python."""
    if not BUSYBOX.is_file():
        pytest.skip("busybox-static is not installed (apt-get install busybox-static)")
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / ".grove").mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    (root / "bin" / "sh").symlink_to("busybox")
    yield root
    # The bind mount lives in a private mount namespace that died with its processes; this proves it.
    with open("/proc/self/mountinfo") as f:
        assert str(root) not in f.read()


PROBE = """
import os, subprocess, {imports}
print("ok")
child = subprocess.run(["/bin/sh", "-c", "echo $LD_LIBRARY_PATH:$PYTHONHOME; env"], capture_output=True, text=True)
print(child.stdout, end="")
try:
    open("/.grove/x", "w")
except OSError as e:
    print("readonly", e.errno)
"""


def _in_busybox_root(bundle: Bundle, root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` chrooted into ``root`` with the bundle bind-mounted read-only at ``/.grove``."""
    # The mount is made inside a new mount namespace with private propagation, so it never reaches
    # the host's mount table and vanishes when the namespace's last process exits, pass or fail.
    script = 'mount --bind "$1" "$2/.grove" && mount -o remount,bind,ro "$2/.grove" && shift && exec chroot "$@"'
    # --kill-child: a timed-out test kills unshare, and its child must not outlive it.
    unshare = ["unshare", "--mount", "--propagation", "private", "--fork", "--kill-child"]
    return _run(
        [*unshare, "/bin/sh", "-c", script, "sh", str(bundle.path), str(root), *argv],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
    )


def test_runs_in_busybox_only_root(bundle: Bundle, busybox_root: Path) -> None:
    proc = _in_busybox_root(bundle, busybox_root, [*bundle.python_argv(), "-c", PROBE.format(imports=_imports())])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "ok"
    assert lines[1] == ":"  # neither LD_LIBRARY_PATH nor PYTHONHOME reaches a spawned command
    child_env = {line.split("=", 1)[0] for line in lines[2:-1]}
    assert child_env <= {"PATH", "PWD", "SHLVL"}, child_env
    assert lines[-1] == "readonly 30"  # EROFS: the sandbox cannot alter the bundle


DAEMON_THREADS = """
import threading, time
def tick():
    while True:
        time.sleep(0.0001)
for _ in range(8):
    threading.Thread(target=tick, daemon=True).start()
time.sleep(0.05)
"""


def test_daemon_threads_exit_cleanly(bundle: Bundle, busybox_root: Path) -> None:
    """At exit CPython ends daemon threads with pthread_exit, for which glibc dlopen()s libgcc_s.

    ldd cannot see that dependency; without the bundled copy most of these runs abort (SIGABRT,
    "libgcc_s.so.1 must be installed for pthread_exit to work").
    """
    loop = 'i=0; while [ $i -lt 10 ]; do "$@" || exit $?; i=$((i+1)); done'
    argv = ["/bin/sh", "-c", loop, "sh", *bundle.python_argv(), "-c", DAEMON_THREADS]
    proc = _in_busybox_root(bundle, busybox_root, argv)
    assert proc.returncode == 0, proc.stderr
