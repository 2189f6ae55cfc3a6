"""Real routers for the tests: ``grove up`` as a subprocess on a free loopback port, with a short state dir.

Nothing here is a fake. :class:`RouterProcess` starts the real router (the ``grove`` CLI of this venv),
waits for its ready file, and hands out SDK clients and raw HTTP. :func:`router_state` owns one state
dir for the life of a fixture: at the end it deletes every sandbox through the API, stops the router
by PID (SIGTERM, then SIGKILL), then checks that nothing of the state dir is left on the host — no
cgroup, no process, no mount, no sandbox directory — cleans up by force whatever was left (only what
belongs to that state dir), and fails the test if anything had leaked. With ``disk_mb`` the state dir is
a size-limited tmpfs of its own (the test's own mount, unmounted at the end however the test ended).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.client import HTTPConnection, HTTPResponse
from pathlib import Path
from typing import Any

import msgpack
import pytest

from artifacts.s3server import EmbeddedS3
from grove.client import Grove, Sandbox
from grove.statedir import StateDir
from router.backends.local import egress_rules
from router.backends.local.backend import LocalBackend
from router.backends.local.cgroups import HIERARCHIES
from router.backends.local.private_net import PrivateNetworks
from router.projects.files import ProjectFiles
from sandbox_image.bundle import build_bundle
from tests.support.executor_fixtures import MSGPACK, Reply, children_of, processes_with
from tests.support.s3_fixtures import new_bucket

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = HIERARCHIES  # memory, pids, cpu (v1) and the unified hierarchy grove accounts CPU in
GROVE_BIN = str(Path(sys.executable).with_name("grove"))
STATE_DISK = "grove-test-statedisk"
"""The source name of the tmpfs a ``router_state(disk_mb=...)`` mounts on its state dir."""
_UNSET = object()

Body = bytes | Iterable[bytes] | None


@functools.cache
def instance_of(state_dir: Path) -> str:
    """The local backend's cgroup instance name for a state dir (what a router there would use).

    Cached: building a backend creates ``images/`` in the state dir, which must not come back after
    the teardown removed the state dir.
    """
    return LocalBackend(state_dir).instance


def instance_cgroups(state_dir: Path) -> list[Path]:
    """The ``grove-<instance>`` parent cgroup dirs of a state dir that exist now."""
    inst = instance_of(state_dir)
    return [p for c in CONTROLLERS if (p := CGROUP_ROOT / c / f"grove-{inst}").is_dir()]


def sandbox_cgroups(state_dir: Path) -> list[Path]:
    """Per-sandbox cgroup dirs under the state dir's instance."""
    return [child for parent in instance_cgroups(state_dir) for child in parent.iterdir() if child.is_dir()]


def cgroup_procs(state_dir: Path, sandbox_id: str, controller: str = "pids") -> list[int]:
    """Host PIDs in one sandbox's cgroup (empty when it is scaled to zero); [] if the cgroup is gone."""
    path = CGROUP_ROOT / controller / f"grove-{instance_of(state_dir)}" / sandbox_id / "cgroup.procs"
    try:
        return [int(p) for p in path.read_text().split()]
    except FileNotFoundError:
        return []


def procs_running(state_dir: Path, sandbox_id: str, part: str, controller: str = "pids") -> list[int]:
    """Host PIDs in one sandbox's cgroup whose command line (arguments joined by spaces) holds ``part``."""
    return [pid for pid in cgroup_procs(state_dir, sandbox_id, controller) if part in cmdline(pid)]


def remains_of(state_dir: Path, sandbox_id: str) -> list[str]:
    """What of a deleted local sandbox is still on the host: its directory, cgroups, loop devices (empty: none)."""
    base = StateDir(state_dir).sandbox(sandbox_id)
    found = [f"cgroup {p}" for p in sandbox_cgroups(state_dir) if p.name == sandbox_id]
    found += [f"loop device {name}" for name in loops_with(f"{base}/")]
    return found + ([f"sandbox dir {base}"] if base.exists() else [])


def wait_removed(state_dir: Path, sandbox_id: str, timeout: float = 30.0) -> None:
    """Until a deleted local sandbox's remains are gone: its delete answers before its teardown's passes remove
    them (router/backends/local/teardown.py)."""
    wait_for(lambda: not remains_of(state_dir, sandbox_id), timeout, 0.05, f"the remains of {sandbox_id} removed")


def mounts_with(needle: str) -> list[str]:
    """Lines of this namespace's mount table that mention ``needle``."""
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
        return [line.strip() for line in fh if needle in line]


def loops_with(needle: str) -> dict[str, str]:
    """Attached loop devices (``loopN``) whose backing file's path mentions ``needle``, with that path."""
    found = {}
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:  # not attached
            continue
        backing = _on_host(backing)
        if needle in backing:
            found[entry.name] = backing
    return found


def _on_host(backing: str) -> str:
    """A loop device's backing path as the host names it: a file on a checkpoint volume (mounted on a state dir's
    ``sandboxes/``) is named from the volume's root once its sandbox's copy of the mount is detached."""
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as fh:
        volumes = [f[1] for f in (line.split() for line in fh) if len(f) > 2 and f[2] == "xfs"
                   and f[1].endswith("/sandboxes")]
    head = backing.removesuffix(" (deleted)").rsplit("/", 1)[0]
    for volume in volumes:
        if head.count("/") == 1 and Path(volume + head).is_dir():
            return volume + backing
    return backing


def layer_file(state_dir: Path, sandbox_id: str, rel: str) -> bytes | None:
    """A file of a sandbox's writable layer as the host holds it (``rel`` relative to the sandbox's /);
    None if the layer has no such file.

    The layer lives in the sandbox's disk image, mounted only inside the sandbox: read it with debugfs
    (read-only, without mounting). A running sandbox's latest writes may still sit in its page cache:
    ``sync`` in the sandbox first. Sandboxes made before disk quotas keep it in a plain ``upper`` dir.
    """
    base = StateDir(state_dir).sandbox(sandbox_id)
    if not (base / "disk.img").exists():
        path = base / "upper" / rel
        return path.read_bytes() if path.is_file() else None
    stat = subprocess.run(["debugfs", "-c", "-R", f"stat /upper/{rel}", str(base / "disk.img")],
                          capture_output=True, check=True)
    if b"Type: regular" not in stat.stdout:
        return None
    cat = subprocess.run(["debugfs", "-c", "-R", f"cat /upper/{rel}", str(base / "disk.img")],
                         capture_output=True, check=True)
    return cat.stdout


def layer_owner(state_dir: Path, sandbox_id: str, rel: str) -> tuple[int, int] | None:
    """The host uid and gid of a file (or directory) in a sandbox's writable layer; None if it has none
    there. As :func:`layer_file`: ``sync`` in a running sandbox first."""
    base = StateDir(state_dir).sandbox(sandbox_id)
    if not (base / "disk.img").exists():
        path = base / "upper" / rel
        if not os.path.lexists(path):
            return None
        st = path.lstat()
        return st.st_uid, st.st_gid
    stat = subprocess.run(["debugfs", "-c", "-R", f"stat /upper/{rel}", str(base / "disk.img")],
                          capture_output=True, check=True, text=True)
    found = re.search(r"User:\s+(\d+)\s+Group:\s+(\d+)", stat.stdout)
    return (int(found.group(1)), int(found.group(2))) if found else None


def to_plain_layer(sandbox_dir: Path) -> None:
    """Rewrite a stopped sandbox's directory into the layout of routers before disk quotas: its layer's
    files (owners and modes kept) in plain ``upper``/``work`` dirs, no disk image."""
    image = sandbox_dir / "disk.img"
    dump = subprocess.run(["debugfs", "-R", f"rdump /upper {sandbox_dir}", str(image)], capture_output=True)
    assert dump.returncode == 0 and (sandbox_dir / "upper").is_dir(), dump.stderr
    (sandbox_dir / "work").mkdir()
    image.unlink()
    shutil.rmtree(sandbox_dir / "disk")


def process_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return False
    return raw[raw.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def fd_count(pid: int) -> int:
    """Open file descriptors of a process."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def proc_status(pid: int, field_name: str) -> int:
    """A ``kB`` field of /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field_name} for {pid}")


def _is_state_disk(line: str, state_dir: Path) -> bool:
    fields = line.split()
    return len(fields) > 2 and fields[0] == STATE_DISK and fields[1] == str(state_dir)


def mount_state_disk(state_dir: Path, size_mb: int) -> None:
    """Put a tmpfs of ``size_mb`` MiB on the (empty) state dir, in the host's mount namespace."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", STATE_DISK, str(state_dir)],
                   check=True, capture_output=True, timeout=30)


def unmount_state_disk(state_dir: Path) -> None:
    """Take the test's tmpfs off the state dir if it is there (detached lazily if something still holds it)."""
    while any(_is_state_disk(line, state_dir) for line in mounts_with(str(state_dir))):
        done = subprocess.run(["umount", str(state_dir)], capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(state_dir)], check=True, capture_output=True, timeout=30)


def leaks(state_dir: Path) -> list[str]:
    """Everything of ``state_dir`` still on the host while no router runs on it (empty: clean); the
    state dir's own test disk is not a leak (the teardown unmounts it)."""
    root = str(state_dir)
    found = [f"cgroup {p}" for p in sandbox_cgroups(state_dir)]
    found += [f"process {pid}: {cmdline(pid)[:200]}" for pid in processes_with(root)]
    found += [f"mount {line}" for line in mounts_with(root) if not _is_state_disk(line, state_dir)]
    found += [f"loop device {name} on {backing}" for name, backing in loops_with(root + "/").items()]
    sandboxes = StateDir(state_dir).sandboxes
    if sandboxes.is_dir():
        found += [f"sandbox dir {p}" for p in sandboxes.iterdir()]
    found += [f"egress veth {name}" for name in egress_veths(state_dir)]
    if egress_table_exists(state_dir):
        found.append(f"nftables table inet {egress_rules.table(instance_of(state_dir))}")
    found += [f"private network hub (netns) {name}" for name in private_hubs(state_dir)]
    return found


def private_hubs(state_dir: Path) -> list[str]:
    """Network namespaces holding the state dir's router's private groups (router/backends/local/private_net.py)."""
    return PrivateNetworks(instance_of(state_dir)).hubs()


def egress_veths(state_dir: Path) -> list[str]:
    """Host-side veths of the state dir's router (sandboxes with egress allowed)."""
    prefix = egress_rules.prefix(instance_of(state_dir))
    return sorted(name for name in os.listdir("/sys/class/net") if name.startswith(prefix))


def egress_table_exists(state_dir: Path) -> bool:
    """Whether the state dir's router has its nftables table on this host."""
    if shutil.which("nft") is None:
        return False
    argv = ["nft", "list", "table", "inet", egress_rules.table(instance_of(state_dir))]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0


def cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by spaces ("?" once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def force_cleanup(state_dir: Path) -> list[str]:
    """Remove whatever a state dir left: its sandboxes' processes (found through its own cgroups and by
    its path in their command line — nothing else), its cgroups, the state dir itself. Returns the cgroups it
    could not remove (a process that would not die within the wait): once the state dir is gone nothing else
    knows them, so a caller must say so."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = set(processes_with(str(state_dir)))
        for cg in sandbox_cgroups(state_dir):
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (cg / "cgroup.procs").read_text().split())
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for cg in sandbox_cgroups(state_dir):
            with contextlib.suppress(OSError):
                cg.rmdir()
        if not pids and not sandbox_cgroups(state_dir):
            break
        time.sleep(0.05)
    for parent in instance_cgroups(state_dir):
        with contextlib.suppress(OSError):
            parent.rmdir()
    for name in egress_veths(state_dir):
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
    if egress_table_exists(state_dir):
        argv = ["nft", "delete", "table", "inet", egress_rules.table(instance_of(state_dir))]
        subprocess.run(argv, capture_output=True, check=False)
    for name in private_hubs(state_dir):
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    for name in loops_with(str(state_dir) + "/"):  # detached now, or once its last user lets go
        subprocess.run(["losetup", "-d", f"/dev/{name}"], capture_output=True, check=False)
    volume = str(StateDir(state_dir).sandboxes)  # the checkpoint volume (router/backends/local/cow.py)
    if any(line.split()[1] == volume for line in mounts_with(volume) if len(line.split()) > 1):
        subprocess.run(["umount", "-l", volume], capture_output=True, check=False)
    unmount_state_disk(state_dir)
    left = [str(cg) for cg in [*sandbox_cgroups(state_dir), *instance_cgroups(state_dir)]]
    shutil.rmtree(state_dir, ignore_errors=True)
    return left


@dataclass
class RouterProcess:
    """One ``grove up`` subprocess on a state dir (restartable on the same port and key)."""

    state_dir: Path
    key: str
    port: int = 0
    """0 until the first start, where the router binds a free port itself (one picked here and bound later could
    be taken in between by another test's process: CI saw it); its later starts reuse it. Routers that must
    know each other's URL before they start (shards) set it."""
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    up_args: tuple[str, ...] = ()
    """Extra ``grove up`` arguments (e.g. ``--backend knative ...``)."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """Extra environment of the router process (e.g. S3 credentials)."""
    backend: str = "local"
    """Which backend the router runs (tests that check it read this)."""
    log_file: Path | None = None
    """Where the router's output goes, if not ``<state>/router.log`` (a test that fills the state disk)."""
    die_with_parent: bool = False
    """SIGTERM the router when the process that started it dies (a benchmark killed outright)."""
    launcher: tuple[str, ...] = ()
    """An argv prefix the router runs under, which must exec it (the stand-in cluster's DNS: a hosts file)."""

    @property
    def url(self) -> str:
        """Base URL of the router."""
        assert self.port, "the router has no port yet: it binds a free one at its first start (or set .port)"
        return f"http://127.0.0.1:{self.port}"

    @property
    def layout(self) -> StateDir:
        """Paths inside the router's state dir."""
        return StateDir(self.state_dir)

    @property
    def pid(self) -> int:
        """PID of the running router process."""
        assert self.proc is not None and self.proc.poll() is None, "the router is not running"
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        """Where the router's stdout and stderr go (appended across restarts)."""
        return self.log_file or self.layout.log

    def log(self) -> str:
        """What the router printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def alive(self) -> bool:
        """Whether the router process runs."""
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 60.0) -> RouterProcess:
        """Start the router and wait until it listens (its ready file holds the URL)."""
        assert not self.alive(), "already running"
        self.starts += 1
        # Beside the log when that is off the state dir (a full test disk could not take the ready file).
        ready = self.log_file.with_name(f"{self.log_file.name}.ready-{self.starts}") if self.log_file else (
            self.state_dir / f"ready-{self.starts}")
        env = {**os.environ, "GROVE_API_KEY": self.key, **self.extra_env}
        env.pop("GROVE_URL", None)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.launcher, GROVE_BIN, "--state-dir", str(self.state_dir), "up", "--port", str(self.port),
                 "--ready-file", str(ready), *self.up_args],
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=_stop_with_parent if self.die_with_parent else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"grove up exited with {self.proc.returncode}:\n{self.log()}")
            said = ready.read_text().strip() if ready.exists() else ""
            if said.startswith("http://127.0.0.1:") and said.rsplit(":", 1)[1].isdigit():
                if not self.port:
                    self.port = int(said.rsplit(":", 1)[1])
                assert said == self.url, f"the router listens on {said}, not on {self.url}"
                return self
            time.sleep(0.02)
        raise RuntimeError(f"grove up not ready after {timeout}s:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Signal the router by PID and wait; SIGKILL if it lingers. Returns its exit code. The wait is long: a
        router with no sandbox left unmounts its checkpoint volume and waits (up to 45 s) for the kernel to let go
        of the volume's loop device, which on a loaded host (two test workers, Chromium) took more than 15 s."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        return proc.returncode

    def client(self, key: Any = _UNSET) -> Grove:
        """A synchronous SDK client (close it, or use it as a context manager)."""
        return Grove(self.url, self.key if key is _UNSET else key)

    def http(
        self,
        method: str,
        path: str,
        body: Body = None,
        *,
        json_body: Any = _UNSET,
        msgpack_body: Any = _UNSET,
        headers: dict[str, str] | None = None,
        key: str | None = None,
        auth: bool = True,
        timeout: float = 60.0,
    ) -> Reply:
        """One raw HTTP request on a fresh connection; the body is read in full."""
        resp, conn = self.send(method, path, body, json_body=json_body, msgpack_body=msgpack_body,
                               headers=headers, key=key, auth=auth, timeout=timeout)
        try:
            return Reply(resp.status, resp.headers, resp.read())
        finally:
            conn.close()

    def send(
        self,
        method: str,
        path: str,
        body: Body = None,
        *,
        json_body: Any = _UNSET,
        msgpack_body: Any = _UNSET,
        headers: dict[str, str] | None = None,
        key: str | None = None,
        auth: bool = True,
        timeout: float = 60.0,
    ) -> tuple[HTTPResponse, HTTPConnection]:
        """Send a request; return the unread response and its connection (the caller closes it)."""
        hdrs = dict(headers or {})
        if auth:
            hdrs.setdefault("Authorization", f"Bearer {key or self.key}")
        if json_body is not _UNSET:
            body = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif msgpack_body is not _UNSET:
            body = msgpack.packb(msgpack_body, use_bin_type=True)
            hdrs.setdefault("Content-Type", MSGPACK)
        conn = HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        conn.request(method, path, body=body, headers=hdrs)
        return conn.getresponse(), conn

    def cli(self, *args: str, timeout: float = 60.0, key: Any = _UNSET) -> subprocess.CompletedProcess[bytes]:
        """Run the ``grove`` CLI against this router and state dir."""
        env = {**os.environ}
        env.pop("GROVE_API_KEY", None)
        if key is _UNSET:
            env["GROVE_API_KEY"] = self.key
        elif key is not None:
            env["GROVE_API_KEY"] = str(key)
        return subprocess.run(
            [GROVE_BIN, "--state-dir", str(self.state_dir), "--url", self.url, *args],
            env=env, capture_output=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        )

    def member_key(self, project: str, label: str = "member") -> str:
        """A new member key of ``project`` made by ``grove key add``, returned once the router takes it and shows
        the project as its file now defines it (the router re-reads its key file and its projects' folder each at
        most once a second, apart: a key taken before the quotas a test just set would be held to older ones)."""
        done = self.cli("key", "add", label, "--project", project)
        assert done.returncode == 0, done.stderr.decode()
        key = done.stdout.decode().strip()
        defined = ProjectFiles(self.state_dir).get(project).to_dict()

        def taken() -> bool:
            shown = self.http("GET", f"/v1/projects/{project}", key=key)
            return shown.status == 200 and {k: shown.json().get(k) for k in defined} == defined

        wait_for(taken, 30, what=f"the new key taken, and project {project} shown as defined")
        return key

    def live_ids(self) -> set[str]:
        """Ids of the router's live sandboxes, of every project (the router's key is an admin's)."""
        reply = self.http("GET", "/v1/sandboxes", headers={"X-Grove-Project": "*"})
        assert reply.status == 200, reply.body[:500]
        return {s["id"] for s in reply.json()["sandboxes"]}

    def delete_all(self, keep: set[str] | frozenset[str] = frozenset()) -> set[str]:
        """Delete every warm pool (with its unclaimed sandboxes), then every live sandbox but ``keep``
        through the API, of every project; return the sandboxes' ids."""
        if not self.alive():
            return set()
        pools = self.http("GET", "/v1/pools", headers={"X-Grove-Project": "*"})
        for pool in pools.json()["pools"] if pools.status == 200 else []:
            self.http("DELETE", f"/v1/pools/{pool['name']}",
                      headers={"X-Grove-Project": pool.get("project") or "default"})
        ids = self.live_ids() - keep
        for sandbox_id in ids:
            self.http("DELETE", f"/v1/sandboxes/{sandbox_id}")
        return ids


def _stop_with_parent() -> None:
    """In the router's child process before exec: SIGTERM when the process that started it dies."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


_PR_SET_PDEATHSIG = 1


_bundle_cache: list[Path] = []


def seed_runtime(state_dir: Path) -> None:
    """Put a copy of the session's runtime bundle into a state dir before its router first starts.

    ``grove up`` builds the bundle into every new state dir (about 2 s of copying, compiling and
    stripping) and reuses one whose stamp is current: the copy makes each start take the reuse path,
    which is what every later start of a router does anyway. The build itself is tested in
    tests/sandbox_image/test_bundle.py and by the routers that opt out (``router_state(seed=False)``).
    A plain copy, not hard links: a test may rebuild or retire a state dir's bundle.
    """
    if not _bundle_cache:
        _bundle_cache.append(build_bundle(Path(tempfile.mkdtemp(prefix="gt-bundle-")) / "runtime").path)
        atexit.register(_drop_bundles)  # a script using router_state outside pytest (no session fixture) too
    subprocess.run(["cp", "-a", str(_bundle_cache[0]), str(StateDir(state_dir).runtime)],
                   check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="session", autouse=True)
def _runtime_bundle_copies() -> Iterator[None]:
    """Removes the session's bundle that :func:`seed_runtime` copies from, once every test is done."""
    yield
    _drop_bundles()


def _drop_bundles() -> None:
    while _bundle_cache:
        shutil.rmtree(_bundle_cache.pop().parent, ignore_errors=True)


def new_state_dir() -> Path:
    """A fresh, short state dir under /tmp (Unix socket paths inside it must stay < 108 bytes)."""
    return Path(os.path.realpath(tempfile.mkdtemp(prefix="gt-")))


@contextlib.contextmanager
def router_state(
    *,
    start: bool = True,
    disk_mb: int | None = None,
    up_args: tuple[str, ...] = (),
    seed: bool = True,
    s3: EmbeddedS3 | None = None,
) -> Iterator[RouterProcess]:
    """A router on a fresh state dir for the block; at exit every trace of it is checked and removed.

    ``disk_mb``: the state dir is a tmpfs of that size (and the router's log lives beside it, not on it).
    ``up_args``: more options for ``grove up``.
    ``seed``: the state dir starts with a copy of the session's runtime bundle (see :func:`seed_runtime`);
    False leaves it empty, so the router's first start builds the bundle itself.
    ``s3``: the router stores in a bucket of its own on this running server (``--s3``) instead of
    starting its embedded one.
    """
    state = new_state_dir()
    instance_of(state)  # remembered now, while the state dir exists
    router = RouterProcess(state, key="gk-" + secrets.token_hex(16), up_args=up_args)
    if s3 is not None:
        router.up_args += ("--s3", s3.endpoint, "--s3-bucket", new_bucket())
        router.extra_env.update({"GROVE_S3_ACCESS_KEY": s3.access_key, "GROVE_S3_SECRET_KEY": s3.secret_key})
    if disk_mb is not None:
        router.log_file = state.with_name(state.name + ".log")
    try:
        if disk_mb is not None:
            mount_state_disk(state, disk_mb)
        if seed:
            seed_runtime(state)
        if start:
            router.start()
        yield router
    finally:
        problems: list[str] = []
        try:
            if start and not router.alive():
                router.start()  # a test that failed with its router down: the next one cleans up
            router.delete_all()
        except Exception as exc:  # the router may be the thing that broke: keep cleaning up
            problems.append(f"deleting sandboxes through the API failed: {exc!r}")
        code = router.stop()
        if code not in (None, 0):
            problems.append(f"the router exited with {code} on SIGTERM")
        problems += leaks(state)
        log = router.log()
        left = force_cleanup(state)
        if router.log_file is not None:
            for path in router.log_file.parent.glob(router.log_file.name + "*"):  # the log and its ready files
                path.unlink()
        assert not left, f"could not remove these cgroups (a process in them would not die): {left}"
        assert not state.exists(), f"could not remove {state}"
        if problems:
            pytest.fail("router state dir was not clean:\n  " + "\n  ".join(problems) + f"\n--- router log:\n{log}")


@pytest.fixture(scope="module")
def router(request: pytest.FixtureRequest) -> Iterator[RouterProcess]:
    """One router per test module, storing in the session's S3 server (a bucket of its own).

    Starting and stopping an embedded S3 server with each module's router cost ~2 s a module; a module
    that looks at the router's embedded server itself (its data dir, its port) is marked
    ``embedded_s3``. ``fresh_router`` and routers of a module's own run their embedded server as ever.
    """
    if request.node.get_closest_marker("embedded_s3") is not None:
        with router_state() as r:
            yield r
    else:
        with router_state(s3=request.getfixturevalue("s3_server")) as r:
            yield r


@pytest.fixture
def fresh_router() -> Iterator[RouterProcess]:
    """A router of its own, for a test that restarts or kills it."""
    with router_state() as r:
        yield r


@pytest.fixture(scope="module")
def sandbox(router: RouterProcess) -> Iterator[Sandbox]:
    """One sandbox shared by a module's tests (on whichever router the module uses); deleted at its end."""
    with router.client() as client:
        shared = client.create(heartbeat=False)
        try:
            yield shared
        finally:
            shared.close()


@pytest.fixture(scope="module")
def pair(router: RouterProcess) -> Iterator[tuple[Sandbox, Sandbox]]:
    """Two sandboxes shared by a module's tests: ``a`` is attacked, ``b`` attacks (or is the bystander)."""
    with router.client() as client:
        a, b = client.create(heartbeat=False), client.create(heartbeat=False)
        try:
            yield a, b
        finally:
            a.close()
            b.close()


@pytest.fixture
def grove(router: RouterProcess) -> Iterator[Grove]:
    """An SDK client of the module's router; every sandbox the test leaves behind is deleted."""
    before = router.live_ids()
    client = router.client()
    try:
        yield client
    finally:
        client.close()
        router.delete_all(keep=before)


def zygote_of(router: RouterProcess) -> int:
    """PID of the router's zygote (the process that forks every sandbox; a child of the router, started with the
    router's first sandbox)."""
    found = sorted(set(processes_with("sandbox_image.zygote")) & set(children_of(router.pid)))
    assert len(found) == 1, found
    return found[0]


@contextlib.contextmanager
def starts_held(router: RouterProcess) -> Iterator[None]:
    """The router's sandbox starts held for the block: its zygote stopped (SIGSTOP, by PID), so no start can end
    meanwhile; resumed (SIGCONT) however the block ends. Hold it for well under the zygote's spawn timeout (60 s)."""
    zygote = zygote_of(router)
    os.kill(zygote, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(zygote, signal.SIGCONT)


def wait_for(predicate: Any, timeout: float, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns something truthy; return that, or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {value!r})")
        time.sleep(interval)


def error_of(reply: Reply) -> dict[str, str]:
    """The ``{"code", "message"}`` of an error reply, insisting on the one error shape."""
    body = reply.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"code", "message"} and err["message"], err
    return dict(err)
