"""The sandbox's user namespace: root inside is an unprivileged id range on the host.

Each sandbox gets its own range of ``RANGE`` host ids starting at a base the router allocates; inside,
ids ``0..RANGE-1`` (root included) map onto it. The namespace is made early by a short-lived holder
process, because its descriptor is needed twice: for the idmapped mounts of the image (owner 0 on disk
reads as the sandbox's root) and, once every privileged step of the set-up is done, for PID 1 to
enter it. The mount, network, UTS, IPC and PID namespaces stay owned by the host's user namespace, so
root inside has no power over them: it cannot mount, change its network or its hostname.

The namespace is *owned* by the sandbox's own root (host id ``base``), not by host root: the kernel
charges per-user counters of processes inside a user namespace to its owner as well (inotify
instances and watches, fanotify groups and marks, ... — ``/proc/sys/user/*``). Owned by host root,
every sandbox's inotify instances counted against host root's 128, so one sandbox holding them left
the others and the host at EMFILE; owned by ``base``, each sandbox has its own 128.
"""

from __future__ import annotations

import os

from sandbox_image import linux

RANGE = 65536
"""Ids per sandbox: the usual 16-bit id space of a Linux system (``nobody`` is 65534)."""


def create(base: int) -> int:
    """A new user namespace mapping ``0..RANGE-1`` to ``base..base+RANGE-1``; returns an fd to it."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder: make the namespace, then wait to be killed
        os.close(ready_r)
        os.close(go_w)
        try:
            # The namespace's owner is the creator's effective uid: become the sandbox's root first.
            os.setgroups([])
            os.setresgid(base, base, base)
            os.setresuid(base, base, base)
            linux.unshare(linux.CLONE_NEWUSER)
            # Our pid as the host's /proc names it: the caller may be PID 1 of a PID namespace of its own,
            # where fork() returned the pid we have in there.
            os.write(ready_w, b"k" + os.readlink("/proc/self").encode())
        except BaseException:
            os.write(ready_w, b"e")
        os.read(go_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        ready = os.read(ready_r, 64)
        if ready[:1] != b"k":
            raise OSError("cannot create the sandbox's user namespace (user namespaces disabled on this host?)")
        holder = int(ready[1:])
        mapping = f"0 {base} {RANGE}\n"
        # The map is written from outside (we have CAP_SETUID/CAP_SETGID here), so setgroups stays allowed.
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{holder}/{name}", "w", encoding="ascii") as fh:
                fh.write(mapping)
        return os.open(f"/proc/{holder}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(go_w)  # the holder's read returns: it exits; the namespace lives on in our fd
        os.waitpid(pid, 0)


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
