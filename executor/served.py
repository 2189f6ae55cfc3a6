"""What one executor app serves with — settings, token, paths, runner, caches — apart from its routes.

The routes (:func:`executor.app.app_shell`) are the same in every sandbox and cost ~3 ms of CPU to build (URL
rules parsed and compiled, Flask's own set-up), paid again in every sandbox when built after the zygote's
fork. So the local backend's zygote builds one shell ahead and each sandbox binds its own :class:`Served` into
its copy. Everything that holds a sandbox's state or a descriptor (the path resolver keeps the root open) is
made here, by :meth:`Slot.bind` in the sandbox itself, never in the zygote.
"""

from __future__ import annotations

import threading

from executor.computer.desktop import desktop_for
from executor.dedup import Deduplicator
from executor.outputs import KeptOutputs
from executor.paths import PathResolver
from executor.processes import Processes
from executor.runner import Runner
from executor.settings import ExecutorSettings
from executor.swerex_sessions import Sessions
from grove.core.errors import Unavailable


class Served:
    """One sandbox's side of an app: made from its settings, in its own filesystem view."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.token = settings.token.encode()
        self.paths = PathResolver(settings.root, settings.workdir)
        self.outputs = KeptOutputs()
        self.runner = Runner(settings, self.paths, self.outputs)
        self.dedup = Deduplicator(settings.dedup_entries)
        self.sessions = Sessions(settings, self.paths)
        self.processes = Processes(settings, self.paths, self.runner)
        self.desktop = desktop_for(settings.desktop, settings.env, self.runner.extra_env)


class Slot:
    """Where a shell's routes find their :class:`Served`: empty until bound, bound once."""

    def __init__(self) -> None:
        self._served: Served | None = None
        self._lock = threading.Lock()

    def bind(self, served: Served) -> None:
        """Give the shell its sandbox; a second bind is a bug (a claim builds a whole new app instead)."""
        with self._lock:
            if self._served is not None:
                raise RuntimeError("this executor app is bound already")
            self._served = served

    def get(self) -> Served:
        """The bound :class:`Served`; an unbound shell serves nothing but ``/healthz``."""
        served = self._served
        if served is None:
            raise Unavailable("the executor is not configured yet", retry_after=1)
        return served
