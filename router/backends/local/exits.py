"""Whether each sandbox's PID 1 still runs, from the kernel's word instead of polling ``/proc``.

The reaper asks every live sandbox at every pass whether its executor still runs, and a delete waited
for PID 1 to die by reading its ``/proc/<pid>/stat`` every 5 ms. One read costs ~25 us of the event loop:
with 1,000 sandboxes alive, each pass held the loop for 20-25 ms, every second, in the middle of the
calls the sandboxes were there for. Here each tree's PID 1 gets a pidfd (``pidfd_open(2)``) the first
time it is asked about; the event loop watches it, and the kernel makes it readable when that process
exits. Asking again is a look-up, a kill goes through the pidfd (it can reach no other process that
took the pid since), and waiting for the death is waiting for that event.

A pid is trusted only with its start time: the pidfd is opened first and the start time checked after,
so a pidfd whose process is the recorded one is kept, and any other is closed (that tree is gone). Where
no pidfd can be had (a kernel without ``pidfd_open``, more trees than :data:`OPEN_SHARE` of the
descriptor limit allows) the answer falls back to reading ``/proc``, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import signal

from router.backends.local import procs

OPEN_SHARE = 8
"""At most 1/8 of the process's descriptor limit is spent on pidfds (the router leaves that share out of
its connection cap)."""
_ZOMBIE_CHECK_S = 0.05
"""How often :meth:`Exits.wait` looks at ``/proc`` while the exit event has not come."""


@dataclasses.dataclass
class _Watch:
    pid: int
    started: int
    fd: int | None
    """The pidfd, while the process runs (closed once it has exited)."""
    exited: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop


class Exits:
    """One pidfd per sandbox tree asked about, by sandbox id, on the running event loop."""

    def __init__(self) -> None:
        self._watched: dict[str, _Watch] = {}
        self._max_open: int | None = None

    def running(self, sandbox_id: str, pid: int, started: int) -> bool:
        """Whether exactly this process (pid and start time) still runs."""
        watch = self._watch(sandbox_id, pid, started)
        if watch is None:
            return procs.alive(pid, started)
        return not watch.exited.done()

    def kill(self, sandbox_id: str, pid: int, started: int) -> None:
        """SIGKILL the process if it is still the recorded one."""
        watch = self._watch(sandbox_id, pid, started)
        if watch is None:
            procs.kill(pid, started)
        elif watch.fd is not None:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                signal.pidfd_send_signal(watch.fd, signal.SIGKILL)

    async def wait(self, sandbox_id: str, pid: int, started: int, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the process to exit, or for its main thread to have (what
        ``/proc`` shows as a zombie): whether one of them has.

        The pidfd turns readable once the whole thread group is gone. A PID 1 whose main thread has exited
        can keep a thread waiting for its namespace to empty, and a process of that namespace that cannot
        die yet (frozen, stuck in the kernel) holds it there: the caller's next step (emptying the
        cgroups, which says what is stuck) must not wait the whole timeout for it. So past the first
        :data:`_ZOMBIE_CHECK_S` without the event, ``/proc`` is read at that pace as well."""
        watch = self._watch(sandbox_id, pid, started)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        if watch is None:  # no pidfd: poll, as before
            while procs.alive(pid, started) and loop.time() < deadline:
                await asyncio.sleep(0.005)
            return not procs.alive(pid, started)
        while not watch.exited.done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(watch.exited), min(left, _ZOMBIE_CHECK_S))
            if not watch.exited.done() and not procs.alive(pid, started):
                return True  # its main thread is gone; the rest is held by what cannot die yet
        return True

    async def settled(self, sandbox_id: str, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) for the kernel's word that the watched PID 1 has exited whole (its pidfd
        readable: the last of its threads gone, which is after every process of its namespace died); whether it
        has. No polling: the event or the timeout. False when no pidfd watches the tree (the caller polls)."""
        watch = self._watched.get(sandbox_id)
        if watch is None:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(watch.exited), timeout_s)
        return watch.exited.done()

    def forget(self, sandbox_id: str) -> None:
        """Stop watching the sandbox's tree (it was deleted or stopped): its pidfd is closed."""
        watch = self._watched.pop(sandbox_id, None)
        if watch is not None:
            self._close(watch)

    def close(self) -> None:
        """Forget every tree (the backend is closing; the trees run on)."""
        for sandbox_id in list(self._watched):
            self.forget(sandbox_id)

    def watched(self) -> int:
        """How many pidfds are open (for the tests and the leak checks)."""
        return sum(1 for watch in self._watched.values() if watch.fd is not None)

    def _watch(self, sandbox_id: str, pid: int, started: int) -> _Watch | None:
        """The sandbox's watch for exactly this process, made on first use; None if no pidfd can be had."""
        watch = self._watched.get(sandbox_id)
        if watch is not None:
            if (watch.pid, watch.started) == (pid, started):
                return watch
            self.forget(sandbox_id)  # a new tree of the sandbox (resumed): the old one's watch goes
        if self._max_open is None:
            self._max_open = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // OPEN_SHARE
        if len(self._watched) >= self._max_open:
            return None
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()
        try:
            fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            fd = None
        except OSError:  # no pidfd_open here, or no descriptor left: read /proc instead
            return None
        if fd is not None and procs.start_time(pid) != started:  # the pid is another process's now
            os.close(fd)
            fd = None
        watch = _Watch(pid, started, fd, exited, loop)
        if fd is None:  # gone already: answered, not kept (a stale record asked about again adds nothing)
            exited.set_result(None)
        else:
            loop.add_reader(fd, self._exited, sandbox_id, fd)
            self._watched[sandbox_id] = watch
        return watch

    def _exited(self, sandbox_id: str, fd: int) -> None:
        """The kernel says the watched process exited (its pidfd is readable)."""
        watch = self._watched.get(sandbox_id)
        if watch is None or watch.fd != fd:  # forgotten meanwhile (its fd already closed)
            return
        self._close(watch)

    @staticmethod
    def _close(watch: _Watch) -> None:
        if watch.fd is not None:
            if not watch.loop.is_closed():
                watch.loop.remove_reader(watch.fd)
            os.close(watch.fd)
            watch.fd = None
        if not watch.exited.done() and not watch.loop.is_closed():
            watch.exited.set_result(None)
