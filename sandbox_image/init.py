"""The local sandbox's init: runs once per sandbox start, from the runtime bundle, as root on the host.

``python -m sandbox_image.init`` reads a JSON config on stdin, unshares a PID namespace and forks its
PID 1 (the zygote, :mod:`sandbox_image.zygote`, forks PID 1 straight into a new PID namespace instead:
one process and one copy of the interpreter's memory less per start). PID 1:

1. joins the sandbox's cgroups, binds the executor's Unix socket (a host path the router reaches) and,
   given a ``uid_base``, makes the sandbox's user namespace (:mod:`sandbox_image.userns`);
2. unshares mount, UTS, IPC and network namespaces;
3. mounts the overlay root (the image read-only below — through an idmapped mount, so its files
   are the sandbox root's — and the sandbox's own layer above), the runtime bundle read-only at
   ``/.grove``, a fresh ``/proc`` and a minimal ``/dev``, brings up ``lo`` in its empty network
   namespace, ``pivot_root``s into the new root, enters the user namespace (root inside is an
   unprivileged id range on the host from here on), drops capabilities, installs the seccomp filter;
4. reports ``{"pid": <host pid of PID 1>}`` (or ``{"error": ...}``) and becomes the executor, serving on
   the socket.

Nothing is mounted in the host's namespace, so nothing can leak there: every mount dies with PID 1.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from sandbox_image import disk, importpaths, linux, seccomp, userns
from sandbox_image.newroot import BadImage, NewRoot, fd_path

if TYPE_CHECKING:
    from executor.serve import ExecutorServer

BUNDLE_MOUNT = "/.grove"
# What every command sees unless the sandbox's env says otherwise (as a container runtime sets them).
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
PTYS_MAX = 128
RESERVED_PORTS = (49999,)
"""Ports the sandbox's own processes are never given when they ask for any free port: E2B's code interpreter
listens on 49999, which lies in the range those ports come from, and a server that starts a Jupyter kernel before
it listens (as code interpreters do) would otherwise find the kernel on its port now and then."""
"""Terminals one sandbox may hold at once (tmux, shells, expect: an agent uses a handful)."""
_DEVICES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "tty": (5, 0)}


def main() -> None:
    """Entry point: config on stdin, one JSON line on stdout (``{"pid"}``, or the :data:`Report` of a failure)."""
    config: dict[str, Any] = json.load(sys.stdin)
    try:
        reply = launch(config)
    except Exception as exc:
        reply = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(reply), flush=True)
    os._exit(1 if "error" in reply else 0)


def launch(config: dict[str, Any]) -> dict[str, Any]:
    """Steps 1 to 4 from a process of its own: forks PID 1 into a new PID namespace and returns ``{"pid"}`` (its
    host pid) once its setup is done, or its failed :data:`Report`. (The zygote forks PID 1 itself and calls
    :func:`become_pid1` in it.)"""
    linux.unshare(linux.CLONE_NEWPID)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        become_pid1(config, lambda reply: os.write(ready_w, json.dumps(reply).encode()))
    os.close(ready_w)
    raw = os.read(ready_r, 65536).decode(errors="replace")
    try:
        reply: dict[str, Any] = json.loads(raw)
    except ValueError:
        return {"error": raw or "sandbox init died during setup"}
    return reply if reply else {"pid": pid}


Report = Callable[[dict[str, Any]], object]
"""How PID 1 says its setup is done: ``{}``, or ``{"error": message}`` (with ``"bad_image": True`` when the image
is at fault: a 422 for the create, not a 503)."""


def become_pid1(config: dict[str, Any], report: Report) -> NoReturn:
    """Steps 1 to 3 in the first process of a new PID namespace, still in the host's other namespaces and
    cgroups: join the sandbox's cgroups, make its namespaces and root, then ``report({})`` (or the error,
    and exit) and serve until killed."""
    try:
        # Before anything else, so that what this process does is charged to the sandbox ("0": this process).
        for procs in config["cgroup_procs"]:
            with open(procs, "w", encoding="ascii") as fh:
                fh.write("0")
        listener = _bind(config["socket"])
        oom_fd = os.open(config["oom_control"], os.O_RDONLY) if config.get("oom_control") else None
        log_fd = os.open(config["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # gunicorn fixes its default chdir to the cwd at import: make that "/", which exists in every root.
        os.chdir("/")
        # Import what the executor needs while the bundle is still at its host path (a no-op when forked
        # from the zygote, which has them).
        import gunicorn.workers.gthread  # noqa: F401

        import executor.app
        import executor.serve  # noqa: F401

        uid_base = config.get("uid_base")
        userns_fd = userns.create(int(uid_base)) if uid_base is not None else None
        linux.unshare(linux.CLONE_NEWNS | linux.CLONE_NEWUTS | linux.CLONE_NEWIPC | linux.CLONE_NEWNET)
        # PID 1's argv names the bundle's host path (inside the state dir): readable by every process
        # of the sandbox in /proc/1/cmdline.
        linux.set_cmdline("grove-executor")
        _setup(config, userns_fd)
    except BadImage as exc:
        report({"error": str(exc), "bad_image": True})
        os._exit(1)
    except BaseException as exc:
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        report({"error": f"{type(exc).__name__}: {exc} (at {where.name}:{where.lineno})"})
        os._exit(1)
    report({})
    # Nothing of whoever started us stays open: stdin from /dev/null, output to the sandbox's log.
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    _serve(config, listener, oom_fd)
    os._exit(0)


def _bind(path: str) -> socket.socket:
    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(256)
    sock.set_inheritable(True)
    return sock


def _setup(config: dict[str, Any], userns_fd: int | None) -> None:
    """PID 1, before serving: the root filesystem, devices, hostname, loopback, pivot_root, then (with
    ``userns_fd``) the sandbox's user namespace, and last the capability and system-call limits.

    Every path under the new root is opened from it (:class:`~sandbox_image.newroot.NewRoot`): what the image
    holds there, a symlink above all, is never followed on the host.
    """
    root = config["merged"]
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    if config.get("disk"):  # the writable layer on the sandbox's own size-limited filesystem
        disk.prepare_layer(config["disk"], config["disk_mount"], config["upper"], config["work"],
                           owner=config.get("uid_base"), rebase_from=config.get("rebase_from"))
    # Paths relative to the sandbox's directory: overlayfs shows its options as given in every
    # mountinfo, and absolute ones would tell the sandbox where the router's state dir is.
    here = os.path.dirname(root)
    lower = _mount_lowers(config.get("layers") or [config["rootfs"]], config["lower"], userns_fd, here)
    os.chdir(here)
    layers = (os.path.relpath(path, here) for path in (config["upper"], config["work"]))
    linux.mount("overlay", root, "overlay", 0, "lowerdir={},upperdir={},workdir={}".format(lower, *layers))
    with NewRoot(root) as new:
        if config.get("bind_host_usr"):
            # The host's own /usr, *not* idmapped: its files stay owned by ids the sandbox's namespace does
            # not map (they read as nobody), so root inside gets only what any user of the host gets, never
            # what host root alone may read (a 0700 directory, a 0600 file) or a setuid-root program.
            linux.bind_at("/usr", new.mount_point("usr"), readonly=True)
        linux.bind_at(config["bundle"], new.mount_point(BUNDLE_MOUNT.lstrip("/")), readonly=True)
        proc_flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
        linux.mount("proc", fd_path(new.mount_point("proc")), "proc", proc_flags)
        _guard_proc(fd_path(new.mounted("proc")))
        dev_flags = linux.MS_NOSUID | linux.MS_NOEXEC
        linux.mount("tmpfs", fd_path(new.mount_point("dev")), "tmpfs", dev_flags, "mode=755,size=65536k")
        _make_dev(new.mounted("dev"))
        linux.sethostname(config["hostname"])
        linux.loopback_up()
        linux.reserve_ports(RESERVED_PORTS)
        new.pivot()
    importpaths.remap_on_import(config["bundle"], BUNDLE_MOUNT)
    # The OOM killer must pick the sandbox's commands, never its executor: commands get the highest
    # score (see command_oom_score_adj); lowering our own needs CAP_SYS_RESOURCE on the host.
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write("-1000")
    except PermissionError:
        pass
    if userns_fd is not None:
        # The last step that needs host privileges is done: from here on PID 1 is the sandbox's root,
        # an unprivileged id on the host. What it creates below is its own.
        userns.enter(userns_fd)
    for sub in ("tmp", "root"):
        os.makedirs(f"/{sub}", exist_ok=True)
    os.chmod("/tmp", 0o1777)
    os.makedirs(config["workdir"], exist_ok=True)
    linux.drop_capabilities_for_children()
    linux.set_undumpable()
    # Last: from here on the calls a sandbox never needs (mounts, modules, kexec, bpf, new user
    # namespaces, ...) fail with EPERM, for the executor and every command it starts.
    seccomp.install()


def _mount_lowers(layers: list[str], at: str, userns_fd: int | None, here: str) -> str:
    """Mount the image's layers (lowest first) read-only under ``at``; return the overlay ``lowerdir`` for
    them (topmost first), in paths relative to ``here``.

    Under a user namespace the layers are seen through idmapped mounts: their root-owned files are the
    sandbox's root's. One idmapped mount per directory that holds layers (``p0``, ...: for a pulled
    image, the whole layer store, so 24 layers cost one mount, not 24), and a short symlink per layer
    (``0 -> p0/<chain id>``, ...), so that the option stays short for a deep image too.
    """
    if len(layers) == 1 and userns_fd is None:
        return os.path.relpath(layers[0], here)
    parents: dict[str, str] = {}
    for i, layer in enumerate(layers):
        parent, name = os.path.split(layer.rstrip("/"))
        if parent not in parents:
            parents[parent] = f"p{len(parents)}"
            os.makedirs(f"{at}/{parents[parent]}", exist_ok=True)
            if userns_fd is not None:
                linux.idmapped_bind(parent, f"{at}/{parents[parent]}", userns_fd, readonly=True)
            else:
                linux.bind(parent, f"{at}/{parents[parent]}", readonly=True)
        link = f"{at}/{i}"
        if os.path.lexists(link):
            os.unlink(link)  # a resumed sandbox made its links on its last start
        os.symlink(f"{parents[parent]}/{name}", link)
    return ":".join(os.path.relpath(f"{at}/{i}", here) for i in reversed(range(len(layers))))


# Kernel knobs a sandbox must not turn (core_pattern and sysrq-trigger reach the host) and files that
# leak host state: the same lists container runtimes use.
_PROC_READ_ONLY = ("bus", "fs", "irq", "sys", "sysrq-trigger")
# cmdline: the host's boot arguments. diskstats, partitions: every loop device, so one sandbox could watch
# another's disk activity; config.gz, interrupts, iomem, ioports, swaps: the host's kernel and hardware.
_PROC_MASKED = ("kcore", "keys", "latency_stats", "timer_list", "timer_stats", "sched_debug", "cmdline",
                "diskstats", "partitions", "config.gz", "interrupts", "iomem", "ioports", "swaps")
_PROC_EMPTIED = ("acpi", "scsi")


def _guard_proc(proc: str) -> None:
    """Cover what a sandbox must not see or turn in its fresh procfs (``proc``: a path of that procfs's root)."""
    for name in _PROC_READ_ONLY:
        if os.path.exists(f"{proc}/{name}"):
            linux.bind(f"{proc}/{name}", f"{proc}/{name}", readonly=True)
    for name in _PROC_MASKED:
        if os.path.isfile(f"{proc}/{name}"):
            linux.bind("/dev/null", f"{proc}/{name}", readonly=True)
    for name in _PROC_EMPTIED:
        if os.path.isdir(f"{proc}/{name}"):
            linux.mount("tmpfs", f"{proc}/{name}", "tmpfs", linux.MS_RDONLY, "size=0")


def _make_dev(dev: int) -> None:
    """Fill the sandbox's fresh ``/dev`` tmpfs (``dev``: a descriptor of its root) with the few devices it gets."""
    for name, (major, minor) in _DEVICES.items():
        os.mknod(name, stat.S_IFCHR | 0o666, os.makedev(major, minor), dir_fd=dev)
        os.chmod(name, 0o666, dir_fd=dev)
    os.mkdir("pts", 0o755, dir_fd=dev)
    # max: the kernel's pty count (kernel.pty.max, 4096, 1024 kept for the host) is one for every devpts
    # instance: without a cap of its own, one sandbox could take every pty the other sandboxes have.
    pts_opts = f"newinstance,ptmxmode=0666,mode=620,max={PTYS_MAX}"
    linux.mount("devpts", f"{fd_path(dev)}/pts", "devpts", linux.MS_NOSUID | linux.MS_NOEXEC, pts_opts)
    os.symlink("pts/ptmx", "ptmx", dir_fd=dev)
    os.mkdir("shm", 0o755, dir_fd=dev)
    linux.mount("tmpfs", f"{fd_path(dev)}/shm", "tmpfs", linux.MS_NOSUID | linux.MS_NODEV, "mode=1777,size=65536k")
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", name, dir_fd=dev)
    os.symlink("/proc/self/fd", "fd", dir_fd=dev)


WORKER_TMP_DIR = "/dev/shm"
SERVER_TEMPLATE: ExecutorServer | None = None
"""The executor's gunicorn application, built ahead of time by the zygote (None when run on its own)."""


def _serve(config: dict[str, Any], listener: socket.socket, oom_fd: int | None) -> None:
    """PID 1 becomes the executor: one gunicorn gthread worker, serving on the inherited socket.

    No gunicorn arbiter: one worker is all a sandbox runs, and PID 1's other duty, reaping orphaned
    background processes, is a thread (:mod:`executor.reaper`). A second Python process per sandbox
    cost ~5 MiB of unshared memory and a good part of the start time.
    """
    from executor.serve import ExecutorServer
    from executor.settings import DesktopSettings, ExecutorSettings

    settings = ExecutorSettings(
        token=config["token"],
        root="/",
        workdir=config["workdir"],
        env={**BASE_ENV, **config["env"]},
        command_oom_score_adj=1000,
        oom_control_path=f"/proc/self/fd/{oom_fd}" if oom_fd is not None else None,
        desktop=DesktopSettings.parse(config.get("desktop")),
    )
    sys.argv = ["grove-executor"]
    from executor import reaper

    reaper.start()
    bind = f"fd://{listener.fileno()}"
    if SERVER_TEMPLATE is not None:  # forked from the zygote, which built one
        server = SERVER_TEMPLATE.retarget(settings, bind)
    else:
        server = ExecutorServer(settings, bind, worker_tmp_dir=WORKER_TMP_DIR)
    server.run_single_worker()


if __name__ == "__main__":
    main()
