"""The local backend: each sandbox a process tree in its own namespaces on this host (no cluster, no Docker).

Per sandbox: cgroups (memory, pids, cpu), a directory ``<state>/sandboxes/<id>/`` holding its disk
image ``disk.img`` (an ext4 filesystem of ``disk_mb`` holding the writable layer and the overlay work dir,
see :mod:`router.backends.local.disk`), mount points and the executor's Unix socket, and one process tree started
by :mod:`sandbox_image.init` from the runtime bundle, its root an unprivileged host id range
(:mod:`router.backends.local.uids`, recorded in the directory's ``userns`` file). Scale-to-zero kills the tree and
keeps the directory; resume starts a new tree over the same layer, in the same id range. Sandboxes made
before disk quotas keep their layer as plain directories (``upper``, ``work``) and resume so.
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

from grove.core.errors import BadGateway, Invalid, NotFound, Unavailable
from grove.statedir import StateDir
from router.backends.base import CheckpointTaken, Endpoint, RunUsage, SandboxSpec, SnapshotUploads, Started
from router.backends.local import disk, layer_commit, procs, references, snapshotting
from router.backends.local.cgroups import CgroupSet, Limits, instance_ids, remove_instance
from router.backends.local.cow import CowVolume
from router.backends.local.egress_rules import parse_allow
from router.backends.local.exits import Exits
from router.backends.local.hogs import HogWatch
from router.backends.local.hostlimits import raise_file_max
from router.backends.local.image_derive import derive
from router.backends.local.image_pull import pull_image
from router.backends.local.images import Image, ImageStore
from router.backends.local.network import RECORD as EGRESS_RECORD
from router.backends.local.network import EgressNetwork
from router.backends.local.private_net import RECORD as PRIVATE_RECORD
from router.backends.local.private_net import PrivateNetworks
from router.backends.local.registry_pull import PullPolicy
from router.backends.local.teardown import Teardown
from router.backends.local.uids import UidRanges, shift_owners
from router.backends.local.unpack_limits import UnpackLimits
from router.backends.local.zygote import Zygote
from sandbox_image.bundle import Bundle, build_bundle, collect_retired
from sandbox_image.init import BASE_ENV

_READY_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 10.0
_DETACH_TIMEOUT_S = 10.0
_SETTLE_TIMEOUT_S = 5.0
"""How long a delete waits for a killed tree's namespace to empty before it polls the cgroups (and answers 503 if a
process outlasts that too: one that cannot take its SIGKILL yet)."""
_DRAIN_TIMEOUT_S = 30.0
"""How long a closing router (and one collecting orphans at its start) waits for deleted sandboxes' remains."""
# Sandbox starts in flight per CPU. A start is CPU work (fork, mounts, the executor's own start-up):
# more at once only slows every one down — 1,000 at once made starts time out — and leaves more
# sandboxes waiting half-made. Callers beyond the limit wait their turn (first come, first served)
# instead of failing. Measured with 500 at once on 2 CPUs: 1, 2, 4 and 8 per CPU give the same
# throughput within noise; exec latency meanwhile grows with it (p50 25, 58, 146, 314 ms).
_STARTS_PER_CPU = 2
# Files in a sandbox's directory: the image digest its layer was made on (for its life) and the stamp of
# the runtime bundle its running tree has mounted (while it runs).
IMAGE_FILE = "image"
# The host id base of the sandbox whose checkpoint a new sandbox's layer came from, until its first start
# re-owned the layer's files to its own range.
_REBASE_FILE = "rebase-from"
_BUNDLE_FILE = "bundle"


class LocalBackend:
    """Sandboxes as namespaced process trees on this machine."""

    name = "local"
    # A SIGKILLed PID 1 first waits for every process of its namespace to die (longer under load).
    exit_grace_s = 2.0
    endpoints_move = False  # a refused socket is a dead executor: the call fails, the next one restarts it
    executor_reaches_storage = False
    host_admission = True
    warm_by_traffic = False  # the router's own reaper scales to zero, from the record a heartbeat touches
    checkpoint_snapshots = False  # its checkpoints are clones of the sandbox's disk (snapshotting.py)
    claim_fixed: tuple[str, ...] = ()

    def __init__(
        self, state_dir: Path, *, concurrent_starts: int | None = None, pull: PullPolicy | None = None,
        image_limits: UnpackLimits | None = None,
    ) -> None:
        self._state = state_dir
        layout = StateDir(state_dir)
        self._sandboxes = layout.sandboxes
        self.images = ImageStore(layout.images, image_limits)
        self._disks = disk.DiskTemplates(layout.disk_templates)
        self._cow = CowVolume(state_dir, self._sandboxes)
        """The reflink-capable file system under ``sandboxes/`` that makes checkpoints copy-on-write."""
        self._runtime = layout.runtime
        # Derived from the state dir, so a restarted router finds its own cgroups and no one else's.
        self.instance = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
        self._bundle: Bundle | None = None
        self.network = EgressNetwork(self.instance)
        self.private = PrivateNetworks(self.instance)
        self._zygote_proc: Zygote | None = None
        self._exits = Exits()
        self.start_slots = concurrent_starts or _STARTS_PER_CPU * len(os.sched_getaffinity(0))
        self._starts = asyncio.Semaphore(self.start_slots)
        self._uids: UidRanges | None = None
        self._hogs: asyncio.Task[None] | None = None
        self._pull = pull
        self._pulls: dict[str, asyncio.Lock] = {}
        self._teardown: Teardown | None = None
        """Deleted sandboxes' remains, removed in batches (router/backends/local/teardown.py); made in open()."""

    @property
    def snapshot_uploads(self) -> SnapshotUploads | None:
        """None: local sandboxes keep their files on this host, and upload no snapshots."""
        return None

    def attach_storage(self, storage: Any) -> None:
        """Local sandboxes keep their files on this host: nothing to keep in object storage."""

    async def open(self) -> None:
        """Build (or reuse) the runtime bundle and the default image."""
        for path in (self._state,):
            if any(c in str(path.resolve()) for c in ",:"):
                raise Invalid(f"the state dir {path} may not contain ',' or ':' (overlayfs cannot take such paths)")
        StateDir(self._state).check_socket_room()
        self._sandboxes.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(disk.check_host)
        await asyncio.to_thread(self._cow.open)  # before anything is written under sandboxes/
        await asyncio.to_thread(raise_file_max)
        self._uids = await asyncio.to_thread(UidRanges, self._sandboxes)
        self._bundle = await asyncio.to_thread(build_bundle, self._runtime)
        await asyncio.to_thread(self.images.ensure_default)
        await asyncio.to_thread(self._collect_retired)
        self._teardown = Teardown(self._sweep, self._released)
        # Sandboxes that use up their CPU quota yield to the others (noisy neighbours; router/backends/local/hogs.py).
        self._hogs = asyncio.create_task(HogWatch(self.instance).run())

    def _zygote(self) -> Zygote:
        assert self._bundle is not None, "open() first"
        if self._zygote_proc is None:
            argv = [*self._bundle.python_argv(str(self._bundle.path)), "-m", "sandbox_image.zygote"]
            self._zygote_proc = Zygote(argv)
        return self._zygote_proc

    async def close(self) -> None:
        """Stop the zygote; sandboxes keep running for the next router to re-adopt."""
        if self._hogs is not None:
            self._hogs.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._hogs
        if self._zygote_proc is not None:
            await self._zygote_proc.close()
        if self._teardown is not None:
            await self._teardown.drain(_DRAIN_TIMEOUT_S)  # left over: orphans the next start removes
            await self._teardown.close()
        self._exits.close()
        remove_instance(self.instance)
        await asyncio.to_thread(self._cow.close)  # only once no sandbox is left on it

    def _dir(self, sandbox_id: str) -> Path:
        return self._sandboxes / sandbox_id

    def check(self, spec: SandboxSpec) -> None:
        """Refuse a malformed egress allow-list (``Invalid`` naming the entry)."""
        if spec.network.egress == "allow":
            parse_allow(spec.network.allow)

    async def image_digest(self, image: str) -> str:
        """The digest of a local image (NotFound names the images there are); with a pull policy, a
        registry reference the store lacks is pulled first."""
        return (await self._image(image)).digest

    async def image_config(self, image: str) -> dict[str, Any]:
        """The image's recorded OCI ``config`` (a build's or a pull's; ``{}``: none), pulling it first as
        :meth:`image_digest` does."""
        name = (await self._image(image)).name
        config: dict[str, Any] = (await asyncio.to_thread(self.images.meta, name)).get("config") or {}
        return config

    async def _image(self, name: str) -> Image:
        try:
            return _usable(self.images.get(name))
        except NotFound:
            if self._pull is None or not references.is_reference(name):
                raise
        # One pull per reference at a time: concurrent creates of a new image wait for the first one's.
        async with self._pulls.setdefault(name, asyncio.Lock()):
            with contextlib.suppress(NotFound):
                return _usable(self.images.get(name))
            options = self._pull.options(references.parse(name).registry)
            return await asyncio.to_thread(pull_image, self.images, name, options=options)

    async def create(self, spec: SandboxSpec) -> Started:
        """Make the directories and cgroups, then start the tree."""
        source = spec.checkpoint
        base = self._dir(spec.id)
        await self._finish_teardown(spec.id)
        try:
            if source is None:
                image = await self._image(spec.image)
            else:  # the layer was made on that version of the image: the child keeps it
                digest = (self._dir(source.sandbox_id) / IMAGE_FILE).read_text(encoding="ascii").strip()
                image = _usable(self.images.version(spec.image, digest))
            for sub in ("merged", "lower"):
                (base / sub).mkdir(parents=True, exist_ok=True)
            # The layer belongs to this version of the image: resume uses it even if the name moves on. Written
            # before anything slow, so that collecting unused image versions (router/housekeeping) sees it in use.
            (base / IMAGE_FILE).write_text(image.digest + "\n", encoding="ascii")
            if source is None:
                await asyncio.to_thread(self._disks.make_image, spec.disk_mb, base / disk.IMAGE_NAME)
            else:
                await asyncio.to_thread(self._restore, source.sandbox_id, source.checkpoint_id, spec.id)
            return await self._start(spec, image, fresh=True)
        except BaseException:
            await self.delete(spec.id, {})
            raise

    async def resume(self, spec: SandboxSpec, handle: dict[str, Any]) -> Started:
        """Start the tree again over the layer it left."""
        base = self._dir(spec.id)
        await self._finish_teardown(spec.id)  # a deleted sandbox's layer is not resumed while it is being removed
        if not base.is_dir():
            raise NotFound(f"sandbox {spec.id} has no files left on this host; it cannot be resumed")
        try:
            digest = (base / IMAGE_FILE).read_text(encoding="ascii").strip()
        except FileNotFoundError:  # made by a grove that did not record it
            image = self.images.get(spec.image)
        else:
            image = self.images.version(spec.image, digest)
        return await self._start(spec, _usable(image))

    async def _start(self, spec: SandboxSpec, image: Image, *, fresh: bool = False) -> Started:
        async with self._starts:
            return await self._start_now(spec, image, fresh)

    async def _start_now(self, spec: SandboxSpec, image: Image, fresh: bool) -> Started:
        assert self._bundle is not None and self._uids is not None, "open() first"
        base = self._dir(spec.id)
        uid_base = await asyncio.to_thread(self._own_layer, base, spec.id)
        cgroups = CgroupSet(self.instance, spec.id)
        cgroups.create(Limits(memory_mb=spec.memory_mb, pids_max=spec.pids_max, cpu=spec.cpu))
        # This run's usage counts from here (the counters live as long as the cgroups, across runs).
        cgroups.reset_memory_peak()
        cpu_before = cgroups.cpu_usec()
        socket_path = base / "executor.sock"
        (base / _BUNDLE_FILE).write_text(self._bundle.stamp + "\n", encoding="ascii")
        config = {
            "id": spec.id,
            "hostname": spec.id[:63],
            "rootfs": str(image.rootfs),
            "layers": [str(p) for p in image.lowers],
            "bind_host_usr": image.bind_host_usr,
            "uid_base": uid_base,
            "lower": str(base / "lower"),
            "merged": str(base / "merged"),
            "bundle": str(self._bundle.path),
            "socket": str(socket_path),
            "cgroup_procs": cgroups.procs_files(),
            "oom_control": cgroups.oom_control(),
            "log": str(base / "executor.log"),
            "token": spec.token,
            "env": spec.env,
            "workdir": spec.workdir,
            "desktop": dict(vars(spec.desktop)) if spec.desktop is not None else None,
        }
        config.update(await self._layer(base, fresh))
        with contextlib.suppress(FileNotFoundError):
            config["rebase_from"] = int((base / _REBASE_FILE).read_text(encoding="ascii"))
        report = await self._zygote().spawn(config)
        if report.get("bad_image"):
            raise Invalid(f"image {spec.image!r} cannot be a sandbox's root: {report['error']}; the image store "
                          "refuses such an image now: remove it and import or pull it again")
        if "error" in report:
            raise Unavailable(f"sandbox init: {report['error']}")
        pid = int(report["pid"])
        started = procs.start_time(pid)
        if started is None:
            raise BadGateway(f"sandbox {spec.id} exited right after it started; see {base / 'executor.log'}")
        handle = {"pid": pid, "start_time": started, "oom_kills": cgroups.oom_kills(), "cpu_usec": cpu_before}
        if spec.network.egress == "allow":  # before ready: a sandbox never answers without its network
            await self._attach_network(spec, base, handle)
        if spec.group is not None:
            await self._join_group(spec, spec.group, base, handle)
        await self._wait_ready(socket_path, spec.id, base)
        (base / _REBASE_FILE).unlink(missing_ok=True)  # re-owned: later starts need not walk the layer
        return Started(Endpoint(f"unix:{socket_path}", spec.token), image.digest, handle)

    async def _layer(self, base: Path, fresh: bool) -> dict[str, str]:
        """Where the sandbox's writable layer is: inside its disk image, or (made before disk quotas) plain dirs.
        ``fresh``: the image was made by this create (a new file no loop device can hold yet)."""
        image = base / disk.IMAGE_NAME
        if not image.exists():
            return {"upper": str(base / "upper"), "work": str(base / "work")}
        # The previous run's mount must be gone before the image is mounted again: two ext4 mounts of
        # one image would corrupt it. It goes with that run's last process, so this rarely waits.
        if not fresh and not await _detached(image):
            raise Unavailable(f"the disk of sandbox {base.name} is still attached to {disk.attached_loops(image)} "
                              "from its previous run; try again")
        mount = base / "disk"
        mount.mkdir(exist_ok=True)
        return {"disk": str(image), "disk_mount": str(mount), "upper": str(mount / "upper"),
                "work": str(mount / "work")}

    def _restore(self, parent_id: str, checkpoint_id: str, sandbox_id: str) -> None:
        """Give a new sandbox a checkpoint's disk, its files owned by the new sandbox's host id range."""
        assert self._uids is not None, "open() first"
        base = self._dir(sandbox_id)
        snapshotting.restore(self._dir(parent_id), checkpoint_id, base / disk.IMAGE_NAME)
        # PID 1 re-owns the files when it mounts the image (sandbox_image/disk.py), at its first start only.
        (base / _REBASE_FILE).write_text(f"{self._uids.base(parent_id)}\n", encoding="ascii")

    async def checkpoint(self, sandbox_id: str, handle: dict[str, Any], checkpoint_id: str) -> CheckpointTaken:
        """Freeze, sync, clone the disk image, thaw (:mod:`router.backends.local.snapshotting`): consistent at one
        instant, the processes frozen only for it."""
        pid, started = handle.get("pid"), handle.get("start_time")
        return await asyncio.to_thread(
            snapshotting.take, self._dir(sandbox_id), CgroupSet(self.instance, sandbox_id),
            pid if isinstance(pid, int) else None, started if isinstance(started, int) else None, checkpoint_id)

    async def delete_checkpoint(self, sandbox_id: str, checkpoint_id: str) -> None:
        """Remove the checkpoint's image (the sandbox's deletion removes all of them with its directory)."""
        await asyncio.to_thread(snapshotting.remove, self._dir(sandbox_id), checkpoint_id)

    def _own_layer(self, base: Path, sandbox_id: str) -> int:
        """The sandbox's host id range, with its layer owned by the range's root (a layer made before
        sandboxes had user namespaces is shifted into the range once). A layer inside a disk image is
        out of reach here: PID 1 owns it to the range when it mounts the image."""
        assert self._uids is not None
        legacy = not (base / "userns").exists()
        uid_base = self._uids.base(sandbox_id)
        (base / "lower").mkdir(exist_ok=True)
        if (base / disk.IMAGE_NAME).exists():
            return uid_base
        if legacy:
            shift_owners(base / "upper", uid_base)
        for sub in ("upper", "work"):
            os.chown(base / sub, uid_base, uid_base)
        return uid_base

    async def _attach_network(self, spec: SandboxSpec, base: Path, handle: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(
                self.network.attach, base, handle["pid"], handle["start_time"], parse_allow(spec.network.allow)
            )
        except BaseException:
            await self._kill(spec.id, handle)
            await asyncio.to_thread(self.network.detach, base)
            raise

    async def _join_group(self, spec: SandboxSpec, group: str, base: Path, handle: dict[str, Any]) -> None:
        try:
            member = await asyncio.to_thread(self.private.join, base, handle["pid"], group)
        except BaseException:
            await self._kill(spec.id, handle)
            await asyncio.to_thread(self._disconnect, base)
            raise
        handle["private_address"] = member.address

    def _disconnect(self, base: Path) -> None:
        """Remove the sandbox's egress link and its place in its private group (either absent is fine)."""
        self.network.detach(base)
        self.private.leave(base)

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
        await asyncio.to_thread(self._disconnect, self._dir(sandbox_id))
        for name in ("executor.sock", _BUNDLE_FILE):
            with contextlib.suppress(FileNotFoundError):
                (self._dir(sandbox_id) / name).unlink()
        await _detached(self._dir(sandbox_id) / disk.IMAGE_NAME)
        await asyncio.to_thread(self._collect_retired)
        return {}

    async def _kill(self, sandbox_id: str, handle: dict[str, Any]) -> set[int]:
        """Kill the tree and what else is in its cgroups; the pids found there (after PID 1's death, usually none)."""
        pid, started = handle.get("pid"), handle.get("start_time")
        cgroups = CgroupSet(self.instance, sandbox_id)
        if isinstance(pid, int) and isinstance(started, int):
            self._exits.kill(sandbox_id, pid, started)
            await self._exits.wait(sandbox_id, pid, started, _STOP_TIMEOUT_S)
            # Its main thread gone, PID 1 may still wait for its namespace's processes to die (a loaded host takes
            # its time over each): the kernel says when they have, so the cgroups need not be polled for them.
            if cgroups.pids():
                await self._exits.settled(sandbox_id, _SETTLE_TIMEOUT_S)
        self._exits.forget(sandbox_id)
        # Killing PID 1 kills its namespace; anything left in the cgroups is collected here.
        left = cgroups.pids()
        for pid_left in left:
            procs.kill(pid_left, procs.start_time(pid_left) or -1)
        return left

    async def delete(self, sandbox_id: str, handle: dict[str, Any]) -> None:
        """Kill the tree and remove its network links; its cgroups and files go in the teardown's next passes.

        Answered once the sandbox can no longer run: its PID 1 is dead and its cgroups hold no process. A
        process still there (one that cannot take its SIGKILL yet) is waited for here, as before, and the
        delete fails with 503 if it outlasts the wait (the reaper finishes it later)."""
        base = self._dir(sandbox_id)
        left = await self._kill(sandbox_id, handle)
        if (base / EGRESS_RECORD).exists() or (base / PRIVATE_RECORD).exists():
            # Before the answer: the links' addresses and rules may be given to the next sandbox.
            await asyncio.to_thread(self._disconnect, base)
        if left:
            await asyncio.to_thread(CgroupSet(self.instance, sandbox_id).destroy)
        assert self._teardown is not None, "open() first"
        self._teardown.add(sandbox_id)

    def _sweep(self, sandbox_ids: list[str]) -> set[str]:
        """One teardown pass (on a worker thread): the ids whose cgroups, loop device and directory are all gone.
        A directory goes only once no loop device holds its disk image."""
        emptied = [sandbox_id for sandbox_id in sandbox_ids
                   if CgroupSet(self.instance, sandbox_id).remove_once() is None]
        if not emptied:  # every one still has a task being reaped: no scan of the loop devices for nothing
            return set()
        held = disk.held_images([self._dir(sandbox_id) / disk.IMAGE_NAME for sandbox_id in emptied])
        gone = set()
        for sandbox_id in emptied:
            if self._dir(sandbox_id) / disk.IMAGE_NAME not in held:
                shutil.rmtree(self._dir(sandbox_id), True)
                gone.add(sandbox_id)
        if gone:
            self._collect_retired()
        return gone

    async def _finish_teardown(self, sandbox_id: str) -> None:
        """The remains of an earlier run of this id removed before it starts again (a create started over)."""
        if self._teardown is not None:
            await self._teardown.finish(sandbox_id, _DETACH_TIMEOUT_S)

    def _released(self, sandbox_id: str) -> None:
        """The sandbox's remains are gone: its host id range may be given out again."""
        if self._uids is not None:
            self._uids.release(sandbox_id)

    async def removed(self, timeout_s: float = _DRAIN_TIMEOUT_S) -> bool:
        """Wait (bounded) until every deleted sandbox's remains are gone; whether they are."""
        return self._teardown is None or await self._teardown.drain(timeout_s)

    def _collect_retired(self) -> None:
        """Delete replaced runtime bundles no running sandbox has mounted and replaced or removed images
        no sandbox was made from. Nothing to do (one directory listing each) unless something was replaced."""
        runtime = self._runtime
        bundles = any(runtime.parent.glob(f".{runtime.name}.retired-*"))
        if not bundles and not self.images.has_retired():
            return
        stamps: set[str] = set()
        digests: set[str] = set()
        for directory in self._sandboxes.iterdir():
            for name, into in ((_BUNDLE_FILE, stamps), (IMAGE_FILE, digests)):
                with contextlib.suppress(OSError):
                    into.add((directory / name).read_text(encoding="ascii").strip())
        if bundles:
            collect_retired(runtime, stamps)
        self.images.collect_retired(digests)

    async def own_fault(self, sandbox_id: str, handle: dict[str, Any], *, rebase: bool = False) -> str | None:
        """An OOM kill in the sandbox's memory cgroup since it started (or the last ``rebase``): its commands
        used the memory, and the kernel's choice of victim (the executor, PID 1) is no fault of the host."""
        kills = CgroupSet(self.instance, sandbox_id).oom_kills()
        before = handle.get("oom_kills")
        if rebase:
            handle["oom_kills"] = kills
            return None
        if isinstance(before, int) and kills > before:
            return f"the sandbox's processes used all of its memory: the out-of-memory killer struck {kills - before}x"
        return None

    async def claim(self, spec: SandboxSpec, handle: dict[str, Any]) -> dict[str, str]:
        """Nothing to change here: a restart starts the tree from the router's record, which holds the claim."""
        return {**BASE_ENV, **spec.env}

    async def is_running(self, sandbox_id: str, handle: dict[str, Any]) -> bool:
        """Whether PID 1 of the sandbox still runs."""
        pid, started = handle.get("pid"), handle.get("start_time")
        return isinstance(pid, int) and isinstance(started, int) and self._exits.running(sandbox_id, pid, started)

    async def usage(self, sandbox_id: str, handle: dict[str, Any]) -> RunUsage:
        """From the sandbox's cgroups (CPU time since this run's start, the run's memory peak) and, while its PID 1
        runs, the filesystem of its writable layer (seen through PID 1's root: the layer is mounted only in the
        sandbox's mount namespace). A handful of small reads, no thread hop."""
        cgroups = CgroupSet(self.instance, sandbox_id)
        cpu, before, peak = cgroups.cpu_usec(), handle.get("cpu_usec"), cgroups.memory_peak_bytes()
        return RunUsage(
            # A run started by a grove that kept no start value counts from the group's making.
            cpu_s=None if cpu is None else max(0, cpu - (before if isinstance(before, int) else 0)) / 1e6,
            memory_peak_mb=None if peak is None else peak / (1 << 20),
            disk_bytes=self._layer_bytes(sandbox_id, handle),
        )

    def _layer_bytes(self, sandbox_id: str, handle: dict[str, Any]) -> int | None:
        """Bytes in use on the sandbox's disk image while its PID 1 runs; None otherwise, and for a layer of plain
        directories (made before disk quotas: on the host's filesystem, whose figures are not the sandbox's)."""
        pid, started = handle.get("pid"), handle.get("start_time")
        if not isinstance(pid, int) or not isinstance(started, int):
            return None
        if not (self._dir(sandbox_id) / disk.IMAGE_NAME).exists():
            return None
        try:
            # An overlay's statfs is its upper layer's filesystem: the sandbox's ext4 image. In use are the blocks
            # of its files and directories, and those its data not yet written has reserved (delayed allocation).
            st = os.statvfs(f"/proc/{pid}/root")
        except OSError:
            return None
        if not procs.alive(pid, started):
            return None  # the pid is another process's now: that root is not the sandbox's
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    async def commit(self, sandbox_id: str, image: str, name: str, meta: dict[str, Any]) -> Image:
        """Store the running sandbox's writable layer as the image ``name`` over the very version of ``image``
        it was made from (:mod:`router.backends.local.layer_commit`)."""
        assert self._uids is not None, "open() first"
        base = self._dir(sandbox_id)
        parent = self.images.version(image, (base / IMAGE_FILE).read_text(encoding="ascii").strip())
        id_base = self._uids.base(sandbox_id)
        return await asyncio.to_thread(layer_commit.commit, self.images, base, CgroupSet(self.instance, sandbox_id),
                                       id_base, parent, name, meta)

    async def derive(self, source: str, name: str, meta: dict[str, Any]) -> Image:
        """Store ``source``'s layers as the image ``name`` with ``meta`` (a build's config and record)."""
        parent = _usable(await self._image(source))
        return await asyncio.to_thread(derive, self.images, name, parent, None, **meta)

    async def collect_orphans(self, known_ids: set[str]) -> list[str]:
        """Delete cgroups and directories of sandboxes this router has no record of."""
        found = instance_ids(self.instance)
        if self._sandboxes.is_dir():
            found |= {p.name for p in self._sandboxes.iterdir() if p.is_dir()}
        orphans = sorted(found - known_ids)
        for sandbox_id in orphans:
            await self.delete(sandbox_id, {})
        await self.removed()  # a start leaves no orphan's remains behind it
        # Egress links of sandboxes that stopped while no router watched, and rules no sandbox claims.
        if self._sandboxes.is_dir():
            dirs = [p for p in self._sandboxes.iterdir() if p.is_dir()]
            await asyncio.to_thread(self.network.reconcile, dirs, procs.alive)
        await asyncio.to_thread(self.private.reconcile)
        return orphans


async def _detached(image: Path) -> bool:
    """Wait (a bounded time) until no loop device holds ``image``; whether none does."""
    deadline = time.monotonic() + _DETACH_TIMEOUT_S
    # One scan of every loop device finds the holders; the poll then reads only theirs, and a last full
    # scan confirms none is left (one attached meanwhile is found there, as the old per-poll scans would).
    # The poll reads a file or two of sysfs (memory, never a disk): on the event loop, not a thread hop each.
    while holders := await asyncio.to_thread(disk.attached_loops, image):
        while holders:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
            holders = disk.attached_loops(image, holders)
    return True


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return "(no executor log)"


def _usable(image: Image) -> Image:
    """``image``, unless no sandbox may start on it (Invalid says why and what to do)."""
    if image.unusable is not None:
        raise Invalid(f"image {image.name!r} cannot be a sandbox's root: {image.unusable}; the image store refuses "
                      "such an image now: remove it (grove image rm) and import or pull it again")
    return image
