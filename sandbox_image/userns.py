"""The sandbox's user namespace: root inside is an unprivileged id range on the host.

Each sandbox gets its own range of ``RANGE`` host ids starting at a base the router allocates; inside,
ids ``0..RANGE-1`` (root included) map onto it. The namespace is made early by a short-lived holder
process (a clone sharing PID 1's memory: :func:`create`), because its descriptor is needed twice: for
the idmapped mounts of the image (owner 0 on disk reads as the sandbox's root) and, once every
privileged step of the set-up is done, for PID 1 to enter it. The mount, network, UTS, IPC and PID
namespaces stay owned by the host's user namespace, so root inside has no power over them: it cannot
mount, change its network or its hostname.

The namespace is *owned* by the sandbox's own root (host id ``base``), not by host root: the kernel
charges per-user counters of processes inside a user namespace to its owner as well (inotify
instances and watches, fanotify groups and marks, ... — ``/proc/sys/user/*``). Owned by host root,
every sandbox's inotify instances counted against host root's 128, so one sandbox holding them left
the others and the host at EMFILE; owned by ``base``, each sandbox has its own 128.
"""

from __future__ import annotations

import os
import signal

from sandbox_image import linux

RANGE = 65536
"""Ids per sandbox: the usual 16-bit id space of a Linux system (``nobody`` is 65534)."""


def create(base: int) -> int:
    """A new user namespace mapping ``0..RANGE-1`` to ``base..base+RANGE-1``; returns an fd to it.

    The holder is cloned into the namespace sharing the caller's memory: a fork of the caller (a whole
    Python interpreter, PID 1 of a sandbox) cost ~4 ms of CPU and ~550 copy-on-write page faults between
    the two. The caller must be single-threaded and root (real and saved uid 0).
    """
    # The namespace's owner is its creator's effective uid and gid: the sandbox's root, for the moment of
    # the clone. The real and saved ids stay 0, so the capabilities come back with the effective uid 0.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # the child runs no handler
    try:
        os.setresgid(-1, base, -1)
        os.setresuid(-1, base, -1)
        try:
            holder = linux.clone_paused(linux.CLONE_NEWUSER)
        finally:
            os.setresuid(-1, 0, -1)
            os.setresgid(-1, 0, -1)
    except OSError as exc:
        raise OSError(f"cannot create the sandbox's user namespace (disabled on this host?): {exc}") from exc
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        # The holder's pid as the host's /proc names it: the caller may be PID 1 of a PID namespace of its
        # own, where clone() returned the pid it has in there.
        host_pid = _host_pid(holder)
        mapping = f"0 {base} {RANGE}\n"
        # The map is written from outside (we have CAP_SETUID/CAP_SETGID here), so setgroups stays allowed.
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{host_pid}/{name}", "w", encoding="ascii") as fh:
                fh.write(mapping)
        return os.open(f"/proc/{host_pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        linux.reap_paused(holder)  # the namespace lives on in our fd


def _host_pid(pid: int) -> int:
    """The pid that ``/proc`` (the host's, still mounted here) gives our child ``pid``: a pidfd's fdinfo
    names it in the pid namespace of the ``/proc`` it is read through."""
    pidfd = os.pidfd_open(pid)
    try:
        with open(f"/proc/self/fdinfo/{pidfd}", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Pid:"):
                    return int(line.split()[1])
    finally:
        os.close(pidfd)
    raise OSError(f"no pid of the user namespace's holder in /proc/self/fdinfo/{pidfd}")


def enter(fd: int) -> None:
    """Become root of the namespace ``fd``: its uid and gid 0, no supplementary groups.

    Entering gives the caller every capability in the new namespace and a full bounding set again, so
    capabilities are dropped *after* this.
    """
    linux.setns(fd, linux.CLONE_NEWUSER)
    os.close(fd)
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
