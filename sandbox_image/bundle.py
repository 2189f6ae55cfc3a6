"""Build the grove runtime bundle: the executor plus everything it needs to run on any Linux image.

The task image may have no Python, or a musl libc, so the bundle carries its own interpreter,
stdlib, third-party packages, grove's packages, every shared library they link (glibc included)
and glibc's dynamic loader. It is started *through* that loader (:meth:`Bundle.python_argv`), so
nothing of the image's ``/lib`` is used and no environment variable has to be set.

Layout (``<root>`` is ``/.grove`` inside a sandbox)::

    <root>/bin/python3.11
    <root>/lib/ld-linux-x86-64.so.2, libpython3.11.so.1.0, libc.so.6, libssl.so.3, ...
    <root>/lib/python3.11/...                 stdlib, with __pycache__
    <root>/lib/python3.11/site-packages/...   flask & co, grove, executor, sandbox_image
    <root>/grove-bundle.json                  stamp, loader and interpreter names

CLI: ``python -m sandbox_image.bundle build DEST [--force]`` and ``... argv DEST``.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import posixpath
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: The third-party distributions the executor imports, with their dependency closure.
DISTRIBUTIONS = (
    "flask",
    "werkzeug",
    "jinja2",
    "markupsafe",
    "itsdangerous",
    "click",
    "blinker",
    "gunicorn",
    "packaging",
    "msgpack",
    "zstandard",
)
#: grove's own packages, copied from the repository (``artifacts`` for the executor's snapshots; its
#: ``minio`` modules are never imported inside a sandbox).
GROVE_PACKAGES = ("grove", "executor", "artifacts", "sandbox_image")
#: Of the ``grove`` package only its shared kernel (``grove/core``, taken whole) goes in: the executor needs the
#: error tree, the wire codec and the exec contract, never the SDK, CLI or workload layer (which would only grow
#: the bundle and change its stamp).
PACKAGE_SUBSETS = {"grove": frozenset({"__init__.py", "py.typed", "core"})}
#: Where the bundle is visible inside a sandbox.
DEFAULT_MOUNT_POINT = "/.grove"
#: The file in the bundle root that records what was built.
MANIFEST = "grove-bundle.json"

_PYVER = f"{sys.version_info.major}.{sys.version_info.minor}"
# Top-level stdlib entries the executor never imports; tkinter's extension would also drag in X11.
_STDLIB_SKIP = frozenset({"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"})
_STDLIB_SKIP_PREFIXES = (f"config-{_PYVER}",)
# Test packages nested inside stdlib packages (unittest/test, ctypes/test, ...).
_NESTED_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_DYNLOAD_SKIP_PREFIXES = ("_test", "_ctypes_test", "_xxtestfuzz", "xxlimited", "_tkinter")
# Only the plain .pyc is used (the executor does not run with -O); the opt-1/opt-2 twins would
# double the size of every __pycache__.
_PYC_SUFFIX = f".{sys.implementation.cache_tag}.pyc"
# glibc dlopen()s libgcc_s for stack unwinding in pthread_exit/pthread_cancel (CPython calls
# pthread_exit for daemon threads at shutdown); ldd cannot see a dlopen, and without it the
# process aborts with "libgcc_s.so.1 must be installed for pthread_exit to work".
_DLOPENED_LIBS = ("libgcc_s.so.1",)
# zstandard's CFFI backend (12 MB) only loads with the `cffi` distribution, which is not bundled;
# zstandard uses its C backend.
_DIST_SKIP_PREFIXES = ("zstandard/_cffi.",)


class BundleError(RuntimeError):
    """The bundle could not be built or read."""


PORTABLE_LOADER = "ld.so"
"""A link in ``lib/`` to the architecture's dynamic loader, for commands written before the arch is known."""


@dataclass(frozen=True)
class Bundle:
    """A built runtime bundle on this host."""

    path: Path
    """The bundle's root directory."""
    stamp: str
    """Content hash of the inputs; equal stamps mean equal bundles."""
    loader: str = "ld-linux-x86-64.so.2"
    """File name of the dynamic loader in ``lib/``."""
    python: str = f"python{_PYVER}"
    """File name of the interpreter in ``bin/``."""

    @classmethod
    def load(cls, path: Path) -> Bundle:
        """Read the bundle built at ``path``; raises :class:`BundleError` if there is none."""
        manifest = _read_manifest(path)
        if manifest is None:
            raise BundleError(f"no runtime bundle at {path}")
        return cls(path, manifest["stamp"], manifest["loader"], manifest["python"])

    def python_argv(self, mount_point: str | os.PathLike[str] = DEFAULT_MOUNT_POINT) -> list[str]:
        """The argv that starts the bundled Python when the bundle is visible at ``mount_point``.

        Append ``-m gunicorn ...`` (or ``-c ...``) to it.
        """
        root = os.fspath(mount_point)
        lib = posixpath.join(root, "lib")
        # Why this works without PYTHONHOME, LD_LIBRARY_PATH, pyvenv.cfg or a ._pth file:
        # * Running ld.so with the program as its argument is how a binary runs without the
        #   image's /lib64/ld-linux-x86-64.so.2 (a musl or busybox image has none).
        # * --library-path is ld.so's own LD_LIBRARY_PATH for this process only: it never enters
        #   the environment, so commands the executor spawns do not inherit it. It also wins over
        #   the DT_RUNPATH the interpreter was linked with (the build host's lib directory).
        # * ld.so hands the program an argv[0] equal to the program path it was given (glibc's
        #   --argv0 would override it; not needed). CPython on Linux derives sys.executable from
        #   argv[0], not /proc/self/exe (which would name ld.so), then walks up from bin/ to the
        #   landmark lib/python3.X/os.py: sys.prefix becomes the bundle root, and site adds
        #   lib/python3.X/site-packages. Hence the bundle must never contain a pyvenv.cfg.
        # * -I (isolated): PYTHON* variables, the user site and the cwd do not reach sys.path,
        #   so nothing the task image sets can change what the executor imports.
        return [
            posixpath.join(lib, self.loader),
            "--library-path",
            lib,
            posixpath.join(root, "bin", self.python),
            "-I",
        ]


def build_bundle(dest: Path, *, repo_root: Path | None = None, force: bool = False) -> Bundle:
    """Build the runtime bundle into ``dest``, or return the one already there if it is current.

    Called on every ``grove up``: when ``dest`` holds a bundle with the same stamp this only
    hashes grove's sources (milliseconds). A build happens in a directory beside ``dest`` and is
    renamed into place, so readers never see a half-built bundle.
    """
    root = (repo_root or Path(__file__).resolve().parent.parent).resolve()
    dest = dest.absolute()
    stamp = _stamp(root)
    if not force and (current := _current(dest, stamp)) is not None:
        return current
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _locked(dest.parent / f".{dest.name}.lock"):
        # Another `grove up` may have built it while we waited for the lock.
        if not force and (current := _current(dest, stamp)) is not None:
            return current
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.build-", dir=dest.parent))
        try:
            loader, python = _build_into(tmp, stamp, root)
            _swap_into_place(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return Bundle(dest, stamp, loader, python)


def _build_into(tmp: Path, stamp: str, repo_root: Path) -> tuple[str, str]:
    """Fill ``tmp`` with a complete bundle; return the loader's and the interpreter's file names."""
    # mkdtemp makes the directory 0700; sandboxes whose root is an unprivileged mapped uid read
    # the bundle as "other".
    tmp.chmod(0o755)
    base = Path(sys.base_prefix)
    python = f"python{_PYVER}"
    interpreter = base / "bin" / python
    if not interpreter.is_file():
        raise BundleError(f"base interpreter {interpreter} not found")
    (tmp / "bin").mkdir()
    shutil.copy2(interpreter, tmp / "bin" / python)
    stdlib = tmp / "lib" / python
    _copy_stdlib(base / "lib" / python, stdlib)
    site = stdlib / "site-packages"
    _copy_distributions(site)
    for rel in _package_files(repo_root):
        _copy_file(repo_root / rel, site / rel)
    # Compile what the copies lack (grove's sources; the whole stdlib when the base install ships
    # without .pyc, as the official python images do): the bundle is read-only at run time, so a
    # missing .pyc would be recompiled in memory on every start. copy2 kept the source mtimes,
    # so the copied .pyc stay valid and are skipped here.
    if not compileall.compile_dir(stdlib, quiet=1, workers=1):
        raise BundleError(f"compiling {stdlib} failed")
    extensions = sorted(stdlib.rglob("*.so"))
    loader = _copy_shared_libraries(tmp, [tmp / "bin" / python, *extensions])
    # One name for the loader on every architecture (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ...):
    # a Knative Service's command is fixed before the scheduler picks a node, and the node's arch picks
    # the runtime image's variant, hence the bundle, hence where this link points.
    if loader != PORTABLE_LOADER:
        (tmp / "lib" / PORTABLE_LOADER).symlink_to(loader)
    _strip_debug_info([tmp / "bin" / python, *extensions, *(tmp / "lib").glob("*.so*")])
    # Written last: a directory without a manifest is never taken for a finished bundle.
    manifest = {"stamp": stamp, "loader": loader, "python": python, "version": sys.version}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return loader, python


def _copy_stdlib(src: Path, dst: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        top = here == src
        dirnames[:] = sorted(
            d
            for d in dirnames
            if not (top and (d in _STDLIB_SKIP or d.startswith(_STDLIB_SKIP_PREFIXES)))
            and not (not top and d in _NESTED_TEST_DIRS)
        )
        in_dynload = here.name == "lib-dynload"
        in_cache = here.name == "__pycache__"
        for name in filenames:
            if in_dynload and name.startswith(_DYNLOAD_SKIP_PREFIXES):
                continue
            if in_cache and not name.endswith(_PYC_SUFFIX):
                continue
            _copy_file(here / name, dst / here.relative_to(src) / name)


def _copy_distributions(site: Path) -> None:
    for name in DISTRIBUTIONS:
        dist = importlib.metadata.distribution(name)
        files = dist.files
        if files is None:
            raise BundleError(f"distribution {name} has no file list (RECORD)")
        for entry in files:
            rel = PurePosixPath(str(entry))
            # Console scripts live outside site-packages (../../../bin/flask); the bundle starts
            # everything with -m instead.
            if ".." in rel.parts or rel.is_absolute():
                continue
            if rel.parent.name == "__pycache__" and not rel.name.endswith(_PYC_SUFFIX):
                continue
            if rel.as_posix().startswith(_DIST_SKIP_PREFIXES):
                continue
            src = Path(str(dist.locate_file(entry)))
            if src.is_file():  # RECORD may name a .pyc that was never written
                _copy_file(src, site / rel)


def _package_files(repo_root: Path) -> list[Path]:
    """The files of grove's packages, relative to ``repo_root``, in a stable order."""
    files: list[Path] = []
    for package in GROVE_PACKAGES:
        top = repo_root / package
        if not (top / "__init__.py").is_file():
            raise BundleError(f"package {package} not found in {repo_root}")
        subset = PACKAGE_SUBSETS.get(package)
        if subset is not None:
            files.extend(Path(package) / f for f in sorted(subset) if (top / f).is_file())
        for dirpath, dirnames, filenames in os.walk(top):
            if subset is not None and Path(dirpath) == top:
                dirnames[:] = sorted(d for d in dirnames if d in subset)  # a directory of the subset: whole
                continue
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            files.extend(
                (Path(dirpath) / f).relative_to(repo_root)
                for f in sorted(filenames)
                if not f.endswith((".pyc", ".pyo")) and not f.startswith(".")
            )
    return files


def _copy_shared_libraries(bundle: Path, binaries: list[Path]) -> str:
    """Copy every library ``binaries`` link, and the loader, into ``bundle/lib``; return the loader's name."""
    libs, loader = _ldd(binaries)
    # A library already in the bundle (a wheel's own .libs directory, reached by $ORIGIN) stays put.
    wanted = {name: path for name, path in libs.items() if not path.is_relative_to(bundle)}
    libdir = wanted.get("libc.so.6", loader).parent
    for name in _DLOPENED_LIBS:
        if name not in wanted and (libdir / name).is_file():
            wanted[name] = libdir / name
    wanted[loader.name] = loader
    for name, path in sorted(wanted.items()):
        # Stored under the name the binaries ask for (the soname), with the symlink resolved.
        shutil.copy2(path, bundle / "lib" / name)
    return loader.name


def _strip_debug_info(binaries: list[Path]) -> None:
    """Drop DWARF debug info, which nobody reads inside a sandbox (pyenv's libpython: 23 → 6 MB).

    Symbol tables stay, so native backtraces still name functions. Without binutils the bundle is
    only bigger, not wrong.
    """
    strip = shutil.which("strip")
    if strip is None:
        return
    proc = subprocess.run([strip, "--strip-debug", *map(str, binaries)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BundleError(f"strip failed: {proc.stderr.strip()}")


def _ldd(binaries: list[Path]) -> tuple[dict[str, Path], Path]:
    """Run ldd on ``binaries``: the libraries they need (soname → file) and the dynamic loader."""
    # LD_PRELOAD would show up as a dependency of everything.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    proc = subprocess.run(["ldd", *map(str, binaries)], capture_output=True, text=True, env=env, check=False)
    libs: dict[str, Path] = {}
    loader: Path | None = None
    missing: list[str] = []
    for line in proc.stdout.splitlines():
        if not line.startswith(("\t", " ")):
            continue  # "file:" headers, "statically linked"
        fields = line.split()
        if fields[0].startswith("linux-vdso") or fields[0].startswith("linux-gate"):
            continue  # provided by the kernel
        if "=>" not in fields:
            if fields[0].startswith("/"):
                loader = Path(fields[0]).resolve()
            continue
        soname, target = fields[0], fields[2]
        if target == "not":
            missing.append(soname)
        elif soname.startswith("ld-linux") or Path(soname).is_absolute():
            loader = Path(target).resolve()
        else:
            libs[soname] = Path(target).resolve()
    if missing:
        raise BundleError(f"ldd found no file for {sorted(set(missing))}")
    if loader is None:
        raise BundleError(f"ldd reported no dynamic loader (exit {proc.returncode}): {proc.stderr.strip()}")
    return libs, loader


def _stamp(repo_root: Path) -> str:
    """Hash of every input of a build: interpreter, distribution versions, grove's sources."""
    h = hashlib.sha256()
    interpreter = Path(sys.base_prefix) / "bin" / f"python{_PYVER}"
    h.update(f"{sys.version}\0{interpreter.resolve()}\0".encode())
    for name in DISTRIBUTIONS:
        h.update(f"{name}=={importlib.metadata.version(name)}\0".encode())
    for rel in _package_files(repo_root):
        h.update(f"{rel.as_posix()}\0".encode())
        h.update(hashlib.sha256((repo_root / rel).read_bytes()).digest())
    return h.hexdigest()[:20]


def _current(dest: Path, stamp: str) -> Bundle | None:
    manifest = _read_manifest(dest)
    if manifest is None or manifest.get("stamp") != stamp:
        return None
    bundle = Bundle(dest, stamp, manifest["loader"], manifest["python"])
    if not (dest / "lib" / bundle.loader).is_file() or not (dest / "bin" / bundle.python).is_file():
        return None
    return bundle


def _read_manifest(path: Path) -> dict[str, str] | None:
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("stamp", "loader", "python")):
        return None
    return {k: v for k, v in data.items() if isinstance(v, str)}


def _swap_into_place(tmp: Path, dest: Path) -> None:
    if not dest.exists():
        tmp.rename(dest)
        return
    # Two renames: a reader can miss `dest` for a moment, but never sees a mix of two bundles. The old
    # bundle is retired, not deleted: running sandboxes have it mounted and still load from it.
    old_manifest = _read_manifest(dest)
    old_stamp = old_manifest["stamp"] if old_manifest else "unknown"
    retired = retired_path(dest, old_stamp)
    if retired.exists():  # the same bundle retired before: this copy is not needed
        doomed = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        doomed.rmdir()
        dest.rename(doomed)
        tmp.rename(dest)
        shutil.rmtree(doomed, ignore_errors=True)
        return
    dest.rename(retired)
    tmp.rename(dest)


def retired_path(dest: Path, stamp: str) -> Path:
    """Where the bundle with ``stamp`` lives once a newer one replaced it at ``dest``."""
    return dest.parent / f".{dest.name}.retired-{stamp}"


def collect_retired(dest: Path, keep: set[str]) -> list[str]:
    """Delete the retired bundles beside ``dest`` whose stamp is not in ``keep`` (those running
    sandboxes still use); return the stamps deleted."""
    deleted = []
    for path in dest.parent.glob(f".{dest.name}.retired-*"):
        stamp = path.name.rsplit("-", 1)[1]
        if stamp not in keep:
            shutil.rmtree(path, ignore_errors=True)
            deleted.append(stamp)
    return deleted


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Serialises concurrent builds of the same bundle (two `grove up` at once).
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _copy_file(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    # copy2 keeps the mtime, which timestamp-based .pyc files are checked against.
    shutil.copy2(src, dst)


def main(argv: list[str] | None = None) -> int:
    """The ``python -m sandbox_image.bundle`` command line."""
    parser = argparse.ArgumentParser(prog="python -m sandbox_image.bundle", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the bundle (a no-op if it is current)")
    build.add_argument("dest", type=Path)
    build.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    show = commands.add_parser("argv", help="print the argv that starts the bundled Python, as JSON")
    show.add_argument("dest", type=Path)
    show.add_argument("--mount-point", default=DEFAULT_MOUNT_POINT, help="where the sandbox sees the bundle")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            bundle = build_bundle(args.dest, force=args.force)
            print(json.dumps({"path": str(bundle.path), "stamp": bundle.stamp}))
        else:
            print(json.dumps(Bundle.load(args.dest.absolute()).python_argv(args.mount_point)))
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
