"""The local backend: each sandbox a process tree in its own namespaces on this host (no cluster, no Docker).

Per sandbox: cgroups (memory, pids, cpu), a directory ``<state>/sandboxes/<id>/`` holding its disk
image ``disk.img`` (an ext4 filesystem of ``disk_mb`` holding the writable layer and the overlay work dir,
see :mod:`router.local.disk`), mount points and the executor's Unix socket, and one process tree started
by :mod:`sandbox_image.init` from the runtime bundle. Scale-to-zero kills the tree and keeps the
directory; resume starts a new tree over the same layer. Sandboxes made before disk quotas keep their
layer as plain directories (``upper``, ``work``) and resume so.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from grove.errors import BadGateway, GroveError, Invalid, NotFound, Unavailable
from router.backends.base import Endpoint, SandboxSpec, Started
from router.local import disk, procs
from router.local.cgroups import CgroupSet, Limits, instance_ids, remove_instance
from router.local.images import Image, ImageStore
from router.local.zygote import Zygote
from sandbox_image.bundle import Bundle, build_bundle

_READY_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_DETACH_TIMEOUT_S = 10.0
# Sandbox starts in flight per CPU. A start is CPU work (fork, mounts, the executor's own start-up):
# more at once only slows every one down — 1,000 at once made starts time out — and leaves more
# sandboxes waiting half-made. Callers beyond the limit wait their turn (first come, first served)
# instead of failing. Measured with 500 at once on 2 CPUs: 1, 2, 4 and 8 per CPU give the same
# throughput within noise; exec latency meanwhile grows with it (p50 25, 58, 146, 314 ms).
_STARTS_PER_CPU = 2


class LocalBackend:
    """Sandboxes as namespaced process trees on this machine."""

    name = "local"

    def __init__(self, state_dir: Path, *, concurrent_starts: int | None = None) -> None:
        self._state = state_dir
        self._sandboxes = state_dir / "sandboxes"
        self.images = ImageStore(state_dir / "images")
        self._disks = disk.DiskTemplates(state_dir / "disk-templates")
        # Derived from the state dir, so a restarted router finds its own cgroups and no one else's.
        self.instance = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
        self._bundle: Bundle | None = None
        self._zygote_proc: Zygote | None = None
        self._starts = asyncio.Semaphore(concurrent_starts or _STARTS_PER_CPU * len(os.sched_getaffinity(0)))

    async def open(self) -> None:
        """Build (or reuse) the runtime bundle and the default image."""
        for path in (self._state,):
            if any(c in str(path.resolve()) for c in ",:"):
                raise Invalid(f"the state dir {path} may not contain ',' or ':' (overlayfs cannot take such paths)")
        self._sandboxes.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(disk.check_host)
        self._bundle = await asyncio.to_thread(build_bundle, self._state / "runtime")
        await asyncio.to_thread(self.images.ensure_default)

    def _zygote(self) -> Zygote:
        assert self._bundle is not None, "open() first"
        if self._zygote_proc is None:
            argv = [*self._bundle.python_argv(str(self._bundle.path)), "-m", "sandbox_image.zygote"]
            self._zygote_proc = Zygote(argv)
        return self._zygote_proc

    async def close(self) -> None:
        """Stop the zygote; sandboxes keep running for the next router to re-adopt."""
        if self._zygote_proc is not None:
            await self._zygote_proc.close()
        remove_instance(self.instance)

    def _dir(self, sandbox_id: str) -> Path:
        return self._sandboxes / sandbox_id

    def check(self, spec: SandboxSpec) -> None:
        """Egress allow-lists need the bridge and NAT rules the local backend does not have yet."""
        if spec.network.egress != "deny":
            raise Invalid(
                "network egress 'allow' is not available on the local backend yet (its sandboxes have no "
                "network at all); use {\"egress\": \"deny\"} or the knative backend"
            )

    async def image_digest(self, image: str) -> str:
        """The digest of a local image (NotFound names the images there are)."""
        return self.images.get(image).digest

    async def create(self, spec: SandboxSpec) -> Started:
        """Make the directories and cgroups, then start the tree."""
        image = self.images.get(spec.image)
        base = self._dir(spec.id)
        try:
            (base / "merged").mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(self._disks.make_image, spec.disk_mb, base / disk.IMAGE_NAME)
            return await self._start(spec, image)
        except BaseException:
            await self.delete(spec.id, {})
            raise

    async def resume(self, spec: SandboxSpec, handle: dict[str, Any]) -> Started:
        """Start the tree again over the layer it left."""
        if not self._dir(spec.id).is_dir():
            raise NotFound(f"sandbox {spec.id} has no files left on this host; it cannot be resumed")
        return await self._start(spec, self.images.get(spec.image))

    async def _start(self, spec: SandboxSpec, image: Image) -> Started:
        async with self._starts:
            return await self._start_now(spec, image)

    async def _start_now(self, spec: SandboxSpec, image: Image) -> Started:
        assert self._bundle is not None, "open() first"
        base = self._dir(spec.id)
        cgroups = CgroupSet(self.instance, spec.id)
        cgroups.create(Limits(memory_mb=spec.memory_mb, pids_max=spec.pids_max, cpu=spec.cpu))
        socket_path = base / "executor.sock"
        config = {
            "id": spec.id,
            "hostname": spec.id[:63],
            "rootfs": str(image.rootfs),
            "bind_host_usr": image.bind_host_usr,
            "merged": str(base / "merged"),
            "bundle": str(self._bundle.path),
            "socket": str(socket_path),
            "cgroup_procs": cgroups.procs_files(),
            "oom_control": cgroups.oom_control(),
            "log": str(base / "executor.log"),
            "token": spec.token,
            "env": spec.env,
            "workdir": spec.workdir,
        }
        config.update(await self._layer(base))
        report = await self._zygote().spawn(config)
        if "error" in report:
            raise Unavailable(f"sandbox init: {report['error']}")
        pid = int(report["pid"])
        started = procs.start_time(pid)
        if started is None:
            raise BadGateway(f"sandbox {spec.id} exited right after it started; see {base / 'executor.log'}")
        handle = {"pid": pid, "start_time": started}
        await self._wait_ready(socket_path, spec.id, base)
        return Started(Endpoint(f"unix:{socket_path}", spec.token), image.digest, handle)

    async def _layer(self, base: Path) -> dict[str, str]:
        """Where the sandbox's writable layer is: inside its disk image, or (made before disk quotas) plain dirs."""
        image = base / disk.IMAGE_NAME
        if not image.exists():
            return {"upper": str(base / "upper"), "work": str(base / "work")}
        # The previous run's mount must be gone before the image is mounted again: two ext4 mounts of
        # one image would corrupt it. It goes with that run's last process, so this rarely waits.
        if not await _detached(image):
            raise Unavailable(f"the disk of sandbox {base.name} is still attached to {disk.attached_loops(image)} "
                              "from its previous run; try again")
        mount = base / "disk"
        mount.mkdir(exist_ok=True)
        return {"disk": str(image), "disk_mount": str(mount), "upper": str(mount / "upper"),
                "work": str(mount / "work")}

    async def _wait_ready(self, socket_path: Path, sandbox_id: str, base: Path) -> None:
        # The socket listens before gunicorn runs, so one request waits in the backlog until the
        # worker serves it: no polling loop.
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(socket_path)), _READY_TIMEOUT_S)
            writer.write(b"GET /healthz HTTP/1.0\r\nHost: executor\r\n\r\n")
            status = await asyncio.wait_for(reader.readline(), _READY_TIMEOUT_S)
            writer.close()
        except (OSError, TimeoutError) as exc:
            raise Unavailable(
                f"executor of sandbox {sandbox_id} is not answering: {exc}; see {base}/executor.log"
            ) from exc
        if b" 200 " not in status:
            log_tail = _tail(base / "executor.log")
            raise Unavailable(f"executor of sandbox {sandbox_id} failed to start: {log_tail}")

    async def stop(self, sandbox_id: str, handle: dict[str, Any]) -> dict[str, Any]:
        """Kill the tree; keep the directory and cgroups."""
        await self._kill(sandbox_id, handle)
        with contextlib.suppress(FileNotFoundError):
            (self._dir(sandbox_id) / "executor.sock").unlink()
        await _detached(self._dir(sandbox_id) / disk.IMAGE_NAME)
        return {}

    async def _kill(self, sandbox_id: str, handle: dict[str, Any]) -> None:
        pid, started = handle.get("pid"), handle.get("start_time")
        if isinstance(pid, int) and isinstance(started, int):
            procs.kill(pid, started)
            deadline = time.monotonic() + _STOP_TIMEOUT_S
            while procs.alive(pid, started) and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
        # Killing PID 1 kills its namespace; anything left in the cgroups is collected here.
        cgroups = CgroupSet(self.instance, sandbox_id)
        for pid_left in cgroups.pids():
            procs.kill(pid_left, procs.start_time(pid_left) or -1)

    async def delete(self, sandbox_id: str, handle: dict[str, Any]) -> None:
        """Kill the tree, remove cgroups and files."""
        await self._kill(sandbox_id, handle)
        try:
            await asyncio.to_thread(CgroupSet(self.instance, sandbox_id).destroy)
        except GroveError:
            raise
        await _detached(self._dir(sandbox_id) / disk.IMAGE_NAME)
        await asyncio.to_thread(shutil.rmtree, self._dir(sandbox_id), True)

    async def is_running(self, sandbox_id: str, handle: dict[str, Any]) -> bool:
        """Whether PID 1 of the sandbox still runs."""
        pid, started = handle.get("pid"), handle.get("start_time")
        return isinstance(pid, int) and isinstance(started, int) and procs.alive(pid, started)

    async def collect_orphans(self, known_ids: set[str]) -> list[str]:
        """Delete cgroups and directories of sandboxes this router has no record of."""
        found = instance_ids(self.instance)
        if self._sandboxes.is_dir():
            found |= {p.name for p in self._sandboxes.iterdir() if p.is_dir()}
        orphans = sorted(found - known_ids)
        for sandbox_id in orphans:
            await self.delete(sandbox_id, {})
        return orphans


async def _detached(image: Path) -> bool:
    """Wait (a bounded time) until no loop device holds ``image``; whether none does."""
    deadline = time.monotonic() + _DETACH_TIMEOUT_S
    while await asyncio.to_thread(disk.attached_loops, image):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no executor log)"
